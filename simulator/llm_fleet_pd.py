"""Prefill/decode disaggregation in simulated time, by link: one function's
prefill and decode pools (emulated engines, ``LARGE`` profile), the pair of
each request chosen by ``controlplane.runtime.disagg.PairPicker`` and its KV
cache moved over the link the two nodes share. Pool k's prefill and decode
instances share node k (4 GPUs each of its 8), so a pair is either on one
node or across two.

The first token comes from the prefill instance (TTFT); the decode instance
starts once the KV bytes have arrived, so the transfer shows in TPOT
(measured from the first token to the last). Links: the same-node path
measured here (a Unix socket, ``disagg.LINKS``), TCP at 10, 25 and 100
Gbit/s, and an RDMA-class link that exists only in the simulator.

    python -m simulator.llm_fleet_pd --pools 8 --speed 2
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from dataclasses import dataclass, field

from controlplane.llm.engine import Engine, Profile, Request, Step
from controlplane.runtime.disagg import (
    LINKS,
    Candidate,
    Link,
    PairPicker,
    RandomPairPicker,
    by_node,
    kv_bytes,
)
from simulator.llm_fleet_workload import LARGE, workload

#: the cross-node links compared (the same-node one is ``LINKS["same-node"]``)
CROSS: dict[str, Link] = {
    "tcp 10 Gbit/s": LINKS["tcp"],
    "tcp 25 Gbit/s": Link("tcp-25g", 25e9 / 8, 100e-6),
    "tcp 100 Gbit/s": Link("tcp-100g", 100e9 / 8, 50e-6),
    "rdma-sim 200 Gbit/s": LINKS["rdma-sim"],
}
#: the link shaped with tc in the kvtransfer bench here (1 Gbit/s: 120 MB/s
#: measured, docs/llm.md), for the pairing comparison
SHAPED = Link("tcp-1g-shaped", 120e6, 100e-6)


@dataclass
class PdOutcome:
    """One link's run."""

    link: str
    requests: int
    good: int
    duration_s: float
    same_node: int
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    #: each request's KV transfer, seconds (over the link its pair shares)
    transfers: list[float] = field(default_factory=list)

    @staticmethod
    def pct(xs: list[float], q: float) -> float:
        """Percentile q (0-100) of xs."""
        s = sorted(xs)
        return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")


def run_pd(
    jobs: list[tuple[float, int, int]],
    cross: Link,
    pools: int,
    prof: Profile = LARGE,
    slo: tuple[float, float] = (1.0, 0.1),
    pairing: str = "aware",
    seed: int = 0,
) -> PdOutcome:
    """Replay (arrival s, prompt tokens, output tokens) on ``pools`` prefill
    and ``pools`` decode instances; every request finishes. pairing:
    ``aware`` (``PairPicker``) or ``random`` (``RandomPairPicker``, seeded)."""
    links = by_node(LINKS["same-node"], cross)
    if pairing == "random":
        picker: PairPicker = RandomPairPicker(
            links, prof.prefill_tps, prof.tpot_per_seq_s, random.Random(seed)
        )
    elif pairing == "aware":
        picker = PairPicker(links, prof.prefill_tps, prof.tpot_per_seq_s)
    else:
        raise ValueError(f"pairing: aware or random, got {pairing!r}")
    pre = [Engine(prof) for _ in range(pools)]
    dec = [Engine(prof) for _ in range(pools)]
    busy: dict[tuple[str, int], Step | None] = {}
    events: list[tuple[float, int, str, object]] = []
    seq, now = 0, 0.0
    out = PdOutcome(cross.name, len(jobs), 0, max(jobs[-1][0], 1e-9) if jobs else 1.0, 0)
    #: request id -> (decode pool index, output tokens, transfer seconds)
    route: dict[str, tuple[int, int, float]] = {}

    def push(t: float, kind: str, arg: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, arg))

    def kick(pool: str, k: int) -> None:
        e = (pre if pool == "p" else dec)[k]
        if busy.get((pool, k)) is None:
            step = e.plan(now)
            busy[(pool, k)] = step
            if step is not None:
                push(step.ends, "step", (pool, k))

    def queued_tokens(e: Engine) -> int:
        return sum(r.prompt_tokens for r in e.waiting) + sum(
            r.prompt_tokens for r in e.running if r.first_token_at is None
        )

    def finish(r: Request, first: float) -> None:
        assert r.finished_at is not None
        tpot = (r.finished_at - first) / max(1, r.generated)
        ttft = first - r.arrived
        out.ttfts.append(ttft)
        out.tpots.append(tpot)
        out.good += int(ttft <= slo[0] and tpot <= slo[1])

    firsts: dict[str, float] = {}
    for k, job in enumerate(jobs):
        push(job[0], "arrive", k)
    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "arrive":
            assert isinstance(arg, int)
            t, ctx, gen = jobs[arg]
            ctx = min(ctx, prof.kv_capacity_tokens // 4)
            pc = [Candidate(f"p{k}", f"n{k}", queued_tokens(e)) for k, e in enumerate(pre)]
            dc = [Candidate(f"d{k}", f"n{k}", len(e.running)) for k, e in enumerate(dec)]
            pair = picker.pick(pc, dc, ctx, prof.kv_bytes_per_token, gen)
            p, d = int(pair.prefill.instance_id[1:]), int(pair.decode.instance_id[1:])
            out.same_node += int(pair.prefill.node_id == pair.decode.node_id)
            req = Request(str(arg), ctx, 1, arrived=t)
            moving = pair.link.transfer_s(kv_bytes(ctx, prof.kv_bytes_per_token))
            out.transfers.append(moving)
            route[req.id] = (d, gen, moving)
            pre[p].submit(req)
            kick("p", p)
        elif kind == "step":
            assert isinstance(arg, tuple)
            pool, k = arg
            step, busy[(pool, k)] = busy[(pool, k)], None
            assert step is not None
            for r in (pre if pool == "p" else dec)[k].complete(step):
                if r.finished_at is None:
                    continue
                if pool == "p":
                    d, gen, moving = route.pop(r.id)
                    assert r.first_token_at is not None
                    firsts[r.id] = r.first_token_at
                    if gen <= 1:
                        finish(r, firsts.pop(r.id))
                    else:
                        nxt = Request(r.id, r.prompt_tokens, gen - 1, arrived=r.arrived)
                        nxt.imported = True
                        push(now + moving, "moved", (d, nxt))
                else:
                    finish(r, firsts.pop(r.id))
            kick(pool, k)
        else:  # the KV cache has arrived at the decode instance
            assert isinstance(arg, tuple)
            d, nxt = arg
            dec[d].submit(nxt)
            kick("d", d)
    return out


def main(argv: list[str] | None = None) -> int:
    """Disaggregated serving by link; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m simulator.llm_fleet_pd", description=__doc__)
    ap.add_argument("--pools", type=int, default=8, help="prefill (and decode) instances")
    ap.add_argument("--minutes", type=float, default=4.0, help="simulated minutes")
    ap.add_argument("--speed", type=float, default=2.0, help="time compression of the trace")
    ap.add_argument(
        "--compare-random",
        action="store_true",
        help="placement-aware against random pairing, KV transfer time by link",
    )
    a = ap.parse_args(argv)
    if a.pools < 1 or a.minutes <= 0 or a.speed <= 0:
        ap.error("--pools, --minutes and --speed must be > 0")
    jobs = [(j.arrive, j.prompt_tokens, j.max_tokens) for j in workload(a.minutes, 1, a.speed)]
    print(
        f"azure llm 2023 code+conv: {len(jobs)} requests, {a.minutes:g} min at {a.speed:g}x, "
        f"{a.pools} prefill + {a.pools} decode instances, {LARGE.name}"
    )
    if a.compare_random:
        compare_random(jobs, a.pools)
        return 0
    print("| cross-node link | same-node pairs | TTFT p50 s | TTFT p99 s | TPOT p99 ms | goodput |")
    print("|---|---|---|---|---|---|")
    for label, link in CROSS.items():
        o = run_pd(jobs, link, a.pools)
        print(
            f"| {label}{' (simulated)' if link.simulated else ''} | "
            f"{o.same_node / max(1, o.requests):.0%} | {o.pct(o.ttfts, 50):.2f} | "
            f"{o.pct(o.ttfts, 99):.2f} | {1000 * o.pct(o.tpots, 99):.0f} | "
            f"{o.good / o.duration_s:.1f} req/s ({o.good / max(1, o.requests):.0%}) |"
        )
    return 0


def compare_random(jobs: list[tuple[float, int, int]], pools: int) -> None:
    """Print placement-aware against random pairing by cross-node link: the
    mean KV transfer per request, its ratio, the links' bandwidth ratio (the
    goal: the transfer ratio at least that), and the ratio's ceiling, random
    against every cache on the faster link (random pairs land on one node
    1/pools of the time, so the ceiling is below the links' ratio)."""
    same, prof = LINKS["same-node"], LARGE
    print(
        "| cross-node link | link ratio | aware: same-node pairs, KV ms mean | random: same-node "
        "pairs, KV ms mean | random / aware | ceiling | TTFT p99 s aware / random | TPOT p99 "
        "ms aware / random |"
    )
    print("|---|---|---|---|---|---|---|---|")
    links = {"tcp 1 Gbit/s (shaped here)": SHAPED, **CROSS}
    for label, link in links.items():
        fast, slow = sorted((same.bandwidth_bytes_per_s, link.bandwidth_bytes_per_s))
        aware, rand = run_pd(jobs, link, pools), run_pd(jobs, link, pools, pairing="random")
        ma, mr = statistics.fmean(aware.transfers), statistics.fmean(rand.transfers)
        best = min((same, link), key=lambda x: x.transfer_s(1 << 30))
        cap = prof.kv_capacity_tokens // 4  # as run_pd caps a prompt
        floor = statistics.fmean(
            best.transfer_s(kv_bytes(min(ctx, cap), prof.kv_bytes_per_token)) for _, ctx, _ in jobs
        )
        n = max(1, len(jobs))
        print(
            f"| {label}{' (simulated)' if link.simulated else ''} | {slow / fast:.2f}x | "
            f"{aware.same_node / n:.0%}, {1000 * ma:.0f} | {rand.same_node / n:.0%}, "
            f"{1000 * mr:.0f} | **{mr / ma:.2f}x** | {mr / floor:.2f}x | "
            f"{aware.pct(aware.ttfts, 99):.2f} / "
            f"{rand.pct(rand.ttfts, 99):.2f} | {1000 * aware.pct(aware.tpots, 99):.0f} / "
            f"{1000 * rand.pct(rand.tpots, 99):.0f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
