"""LLM routing in simulated time: emulated engines (``controlplane.llm.engine``)
behind the same pickers the gateway uses (``controlplane.runtime.llmpicker``), fed
by the same load book (``controlplane.runtime.llmsignals``) refreshed at a scrape
interval. Nothing here re-implements a policy: it moves simulated time,
submits requests, completes engine iterations and samples /metrics-equivalent
signals.

    python -m simulator.llm_routing shared-prefix --instances 8
    python -m simulator.llm_routing mooncake --instances 8 --minutes 20

Workloads: ``shared-prefix`` (several long system prompts, many users each,
Poisson arrivals) and ``mooncake`` (the Mooncake conversation trace: real
arrival times and 512-token block hash ids, ``../shared/data/mooncake-2025``).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.llm.engine import Engine, Profile, QueueFull, Request, Step
from controlplane.llm.profiles import profile
from controlplane.llm.server import PREFIX_BLOCKS_REPORTED
from controlplane.runtime.llmpicker import Ask, Candidate, make
from controlplane.runtime.llmsignals import LoadBook, Sample, digest
from simulator.traces import DATA

MOONCAKE = DATA / "mooncake-2025" / "conversation_trace.jsonl"
#: the policies compared: (label, picker policy, weights)
POLICIES: dict[str, tuple[str, dict[str, float] | None]] = {
    "round-robin": ("round-robin", None),
    "least-request": ("least-request", None),
    "llm (approx prefix)": ("llm", None),
    "llm (precise prefix)": ("llm", {"prefix_precise": 3.0, "queue": 2.0, "kv": 2.0}),
}


@dataclass(frozen=True)
class Job:
    """One request of a workload."""

    arrive: float
    prompt_tokens: int
    max_tokens: int
    blocks: tuple[str, ...]


@dataclass
class Result:
    """One policy's run."""

    policy: str
    done: int
    refused: int
    ttft: list[float]
    e2e_end: float
    output_tokens: int
    prefix_hit: float

    def pct(self, q: float) -> float:
        """TTFT percentile q (0-100), seconds."""
        if not self.ttft:
            return float("nan")
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]

    @property
    def throughput(self) -> float:
        """Output tokens per second of simulated time until the last finish."""
        return self.output_tokens / self.e2e_end if self.e2e_end > 0 else 0.0


def for_blocks(p: Profile, block_tokens: int, cache_tokens: int = 0) -> Profile:
    """The profile with ``block_tokens``-token blocks and a prefix cache of
    ``cache_tokens`` (0: as large as its KV cache, since vLLM's prefix cache
    is the free KV blocks; more models a host-memory KV offload)."""
    tokens = cache_tokens or p.kv_capacity_tokens
    return dataclasses.replace(
        p, block_tokens=block_tokens, prefix_cache_blocks=tokens // block_tokens
    )


def simulate(
    jobs: Sequence[Job],
    policy: str,
    instances: int,
    prof: Profile,
    scrape_s: float = 0.1,
    weights: dict[str, float] | None = None,
    report_blocks: int = PREFIX_BLOCKS_REPORTED,
) -> Result:
    """Run ``jobs`` through ``instances`` engines picked by ``policy``."""
    now = 0.0
    engines = [Engine(prof) for _ in range(instances)]
    names = [f"i{k}" for k in range(instances)]
    picker = make(policy, lambda: now, weights)
    book = LoadBook(max_age_s=10 * scrape_s)
    inflight = [0] * instances
    busy: list[Step | None] = [None] * instances
    owner: dict[int, int] = {}
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, kind: str, arg: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, arg))

    def kick(k: int) -> None:
        if busy[k] is None:
            step = engines[k].plan(now)
            if step is not None:
                busy[k] = step
                push(step.ends, "step", k)

    for j, job in enumerate(jobs):
        push(job.arrive, "arrive", j)
    push(0.0, "scrape", 0)
    ttft: list[float] = []
    refused = out = 0
    end = 0.0
    pending = len(jobs)
    while events and pending:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "scrape":
            for k, e in enumerate(engines):
                book.observe(names[k], _sample(e, report_blocks), now)
            push(now + scrape_s, "scrape", 0)
        elif kind == "arrive":
            job = jobs[arg]
            cands = [
                Candidate(names[k], inflight[k], book.get(names[k], now)) for k in range(instances)
            ]
            k = names.index(picker.pick(cands, Ask(job.blocks)))
            req = Request(str(arg), job.prompt_tokens, job.max_tokens, job.blocks, now)
            try:
                engines[k].submit(req)
            except (QueueFull, ValueError):
                refused += 1
                pending -= 1
                continue
            inflight[k] += 1
            owner[id(req)] = k
            kick(k)
        else:  # an iteration ends
            step, busy[arg] = busy[arg], None
            assert step is not None
            for r in engines[arg].complete(step):
                if r.generated == 1 and r.first_token_at is not None:
                    ttft.append(r.first_token_at - r.arrived)
                if r.finished_at is not None:
                    inflight[arg] -= 1
                    out += r.generated
                    end = max(end, r.finished_at)
                    pending -= 1
            kick(arg)
    q = sum(e.counters.prefix_queries for e in engines)
    hits = sum(e.counters.prefix_hits for e in engines)
    return Result(policy, len(ttft), refused, ttft, end, out, hits / q if q else 0.0)


def _sample(e: Engine, report_blocks: int) -> Sample:
    return Sample(
        waiting=len(e.waiting),
        running=len(e.running),
        kv_usage=e.kv_usage,
        generation_tokens=float(e.counters.generation_tokens),
        blocks=frozenset(digest(reversed(e.prefix), report_blocks, e.profile.prefix_cache_blocks)),
    )


def shared_prefix(
    n: int,
    rate: float,
    prompts: int = 32,
    system_tokens: int = 6000,
    user_tokens: int = 300,
    output_tokens: int = 100,
    block_tokens: int = 16,
    seed: int = 1,
) -> list[Job]:
    """Several long system prompts, many users each: a request is one
    system prompt (uniform) plus its own user part; Poisson arrivals."""
    rnd = random.Random(seed)
    sys_blocks = system_tokens // block_tokens
    t = 0.0
    jobs = []
    for j in range(n):
        t += rnd.expovariate(rate)
        s = rnd.randrange(prompts)
        blocks = tuple(f"s{s}.{b}" for b in range(sys_blocks))
        blocks += tuple(f"s{s}.u{j}.{b}" for b in range(user_tokens // block_tokens))
        jobs.append(Job(t, system_tokens + user_tokens, output_tokens, blocks))
    return jobs


def mooncake(path: Path, minutes: float, speed: float = 1.0) -> list[Job]:
    """The Mooncake conversation trace's first ``minutes``, time divided by
    ``speed``; hash ids are its 512-token prefix blocks (ids are already
    prefix-unique, so they are used as the chained hashes)."""
    jobs = []
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            t = r["timestamp"] / 1000.0
            if t > minutes * 60:
                break
            blocks = tuple(str(h) for h in r["hash_ids"])
            jobs.append(Job(t / speed, int(r["input_length"]), int(r["output_length"]), blocks))
    return jobs


def table(results: Iterable[Result], base: str = "least-request") -> str:
    """Markdown rows: policy, TTFT p50/p90/p99, throughput, hit rate, ratios."""
    rs = list(results)
    ref = next(r for r in rs if r.policy == base)
    lines = [
        "| policy | done | refused | TTFT p50 s | p90 s | p99 s | output tok/s | prefix hit "
        f"| p99 vs {base} | tok/s vs {base} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rs:
        lines.append(
            f"| {r.policy} | {r.done} | {r.refused} | {r.pct(50):.3f} | {r.pct(90):.3f} | "
            f"{r.pct(99):.3f} | {r.throughput:.0f} | {r.prefix_hit:.0%} | "
            f"{ref.pct(99) / r.pct(99):.1f}x | {r.throughput / ref.throughput:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Compare the policies on one workload; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m simulator.llm_routing", description=__doc__)
    ap.add_argument("workload", choices=("shared-prefix", "mooncake"))
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--profile", default="llama2-13b-a100")
    ap.add_argument("--requests", type=int, default=3000, help="shared-prefix: how many")
    ap.add_argument("--rate", type=float, default=16.0, help="shared-prefix: requests/s")
    ap.add_argument("--minutes", type=float, default=20.0, help="mooncake: trace prefix")
    ap.add_argument("--speed", type=float, default=1.0, help="mooncake: time compression")
    ap.add_argument("--scrape-ms", type=float, default=100.0)
    ap.add_argument(
        "--cache-tokens", type=int, default=0, help="prefix cache per instance (0: KV capacity)"
    )
    a = ap.parse_args(argv)
    if (
        a.instances < 1
        or a.requests < 1
        or a.rate <= 0
        or a.speed <= 0
        or a.scrape_ms <= 0
        or a.cache_tokens < 0
    ):
        ap.error(
            "--instances, --requests, --rate, --speed, --scrape-ms must be > 0, --cache-tokens >= 0"
        )
    try:
        base = profile(a.profile)
    except ValueError as e:
        ap.error(str(e))
    if a.workload == "shared-prefix":
        prof = for_blocks(base, 16, a.cache_tokens)
        jobs = shared_prefix(a.requests, a.rate)
    else:
        prof = for_blocks(base, 512, a.cache_tokens)
        jobs = mooncake(MOONCAKE, a.minutes, a.speed)
    results = [
        dataclasses.replace(
            simulate(jobs, pol, a.instances, prof, a.scrape_ms / 1000, w), policy=label
        )
        for label, (pol, w) in POLICIES.items()
    ]
    print(f"{a.workload}: {len(jobs)} requests, {a.instances} instances, profile {a.profile}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
