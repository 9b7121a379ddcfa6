"""Placement-aware against random pairing on real links: the KV transfer
time of each pairing's choices, the caches really moved.

    python -m controlplane.bench.pdpairing --requests 40 --size-mb 16 --rate-mbit 1000

Two hosts: this one (the prefill side, and a decode instance on the same
node, reached through shared memory) and a network namespace behind a veth
shaped to ``--rate-mbit`` with ``tc`` (a decode instance on another host).
The sender goes through a KV relay as a prefill instance in a bubblewrap
sandbox does (``nodeagent.entry.kvrelay``, in this process). For each
request ``disagg.PairPicker`` (placement-aware) and ``RandomPairPicker``
(seeded) choose among the pairs with the links' raw throughput measured in
the same run, and the cache is moved where each chose, the two pickers'
moves interleaved. Reported: each picker's mean transfer, their ratio, the
links' ratio (each link's mean move, over both pickers' moves; the goal:
the transfer ratio at least that), and the ceiling random pairing allows
(its mean over every cache on the faster link). Needs root (namespaces,
tc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controlplane.bench import kvtransfer as kt
from controlplane.bench.shapedlink import ShapedHost
from controlplane.llm import kvsend
from controlplane.nodeagent.entry.kvrelay import KvRelay
from controlplane.nodeagent.entry.kvroute import KvRoutes, Member
from controlplane.runtime import kvmove
from controlplane.runtime.disagg import Candidate, Link, PairPicker, RandomPairPicker, by_node
from controlplane.runtime.kvaddr import shm_target


async def _move(target: str, http: str, relay: str, nbytes: int) -> float:
    kv_id = os.urandom(8).hex()
    took = await kvsend.send(target, kv_id, nbytes, 1, instance=kt.INSTANCE, relay=relay)
    await asyncio.to_thread(kt.delete, f"{http}/v1/kv/{kv_id}")
    return took


async def run(requests: int, size_mb: int, rate_mbit: float, seed: int) -> dict[str, Any]:
    """Both pickers on the same requests; the report (module docstring)."""
    nbytes = size_mb * kt.MIB
    work = Path(tempfile.mkdtemp(prefix="galaxy-bench-pair-"))
    relay = KvRelay(KvRoutes(None, (1024, 65536), lambda: time.time_ns() // 1_000_000))
    inbox = 4 * size_mb + 16
    try:
        unix = str(work / "sink.sock")
        via = str(work / "pre" / "kv.sock")
        relay.prepare(work / "pre", None)
        relay.prepare(work / "dec", None)
        relay.open(Member("pre", "", "pre", "", "127.0.0.1:1"), work / "pre", None)
        relay.open(Member(kt.INSTANCE, "", "dec", "pre", "127.0.0.1:2"), work / "dec",
                   kvmove.seqpacket)  # fmt: skip
        with (
            kt._host((), "127.0.0.1", inbox, unix),
            ShapedHost(rate_mbit, prefix="galaxy-pair") as host,
            kt._host(host.exec_prefix, host.host_ip, inbox, None),
        ):
            near_http, far_http = f"http://127.0.0.1:{kt.PORT}", f"http://{host.host_ip}:{kt.PORT}"
            raw_near = kt._raw_throughput(("unix", unix), max(nbytes, 64 * kt.MIB))
            raw_far = kt._raw_throughput(("tcp", f"{host.host_ip}:{kt.SINK_PORT}"), 64 * kt.MIB)
            links = by_node(Link("same-node", raw_near), Link("shaped", raw_far, 100e-6))
            # One prefill instance here; decode instances here and there.
            pre = [Candidate("pre", "here")]
            dec = [Candidate("near", "here"), Candidate("far", "there")]
            pickers = {
                "aware": PairPicker(links, 2000.0, 0.0),
                "random": RandomPairPicker(links, 2000.0, 0.0, random.Random(seed)),
            }
            ways = {"near": (shm_target(kt.INSTANCE), near_http), "far": (far_http, far_http)}
            times: dict[str, list[float]] = {k: [] for k in pickers}
            chosen: dict[str, list[str]] = {k: [] for k in pickers}
            for i in range(requests):
                names = list(pickers) if i % 2 == 0 else list(pickers)[::-1]
                for name in names:
                    pair = pickers[name].pick(pre, dec, size_mb, kt.MIB)
                    target, http = ways[pair.decode.instance_id]
                    times[name].append(await _move(target, http, via, nbytes))
                    chosen[name].append(pair.decode.instance_id)
            # Each link's own speed: the mean of every move over it (the raw
            # streams above steer the pickers; on a loaded machine a Python
            # sink reads slower than shared memory moves).
            per: dict[str, list[float]] = {"near": [], "far": []}
            for k in pickers:
                for t, c in zip(times[k], chosen[k], strict=True):
                    per[c].append(t)
            link_s = {c: statistics.fmean(v) if v else float("nan") for c, v in per.items()}
    finally:
        await relay.close_all()
        shutil.rmtree(work, ignore_errors=True)
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    return {
        "requests": requests, "bytes": nbytes, "rate_mbit": rate_mbit, "seed": seed,
        "raw_bytes_per_s": {"same node": raw_near, "shaped": raw_far},
        "link_s": link_s,
        "link_ratio": max(link_s.values()) / min(link_s.values()),
        "mean_s": mean, "random_over_aware": mean["random"] / mean["aware"],
        "ceiling": mean["random"] / min(link_s.values()),
        "same_node_share": {k: v.count("near") / len(v) for k, v in chosen.items()},
        "times": times,
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| picker | same-node pairs | KV transfer mean ms |",
        "|---|---|---|",
    ]
    for k in ("aware", "random"):
        lines.append(f"| {k} | {r['same_node_share'][k]:.0%} | {1000 * r['mean_s'][k]:.1f} |")
    ls = r["link_s"]
    lines.append(
        f"\nrandom / aware: **{r['random_over_aware']:.2f}x**; links (mean move): same node "
        f"{1000 * ls['near']:.1f} ms, shaped {1000 * ls['far']:.1f} ms, ratio "
        f"{r['link_ratio']:.1f}x; ceiling (random over every cache on the faster link): "
        f"{r['ceiling']:.2f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--size-mb", type=int, default=16, help="each cache, MiB")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="the shaped link's rate")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    if not 2 <= a.requests <= 1000 or not 1 <= a.size_mb <= 512 or not a.rate_mbit > 0:
        p.error("--requests 2..1000, --size-mb 1..512, --rate-mbit > 0")
    if os.geteuid() != 0:
        print("pdpairing bench: needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    r = asyncio.run(run(a.requests, a.size_mb, a.rate_mbit, a.seed))
    print(render(r))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
