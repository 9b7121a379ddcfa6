"""What the bubblewrap sandbox adds to a cold start, measured in one run
(`python -m controlplane.bench.sandbox`).

The echo example's instance is started (to ready: its /healthz answering)
and stopped again and again on two backends of one node agent process,
alternating between them in each round so the machine's drift hits both
alike: ``process`` (a plain subprocess) and ``bwrap`` (the default sandbox,
routed entry included: a root agent gives each instance a veth), and
variants of bwrap.
Both with per-instance cgroups when they can be made, as under `galaxy up`.
Prints p50/p90 of start-to-ready per backend and the p50 difference (the
goal: at most 20 ms; docs/security.md, "What it costs").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from controlplane.nodeagent.entry.routes import DEFAULT_SUBNET, RoutePool, parse_subnet
from controlplane.nodeagent.entry.routing import Routes
from controlplane.nodeagent.sandbox import BwrapBackend, ProcessBackend
from controlplane.nodeagent.sandbox.cgroups import open_cgroups
from controlplane.nodeagent.sandbox.launch import resolve
from galaxy.v1 import common_pb2

ECHO = Path(__file__).resolve().parents[2] / "examples" / "echo_server.py"


def _spec(egress: bool = False) -> common_pb2.FunctionSpec:
    # The same interpreter for both: the one the sandbox resolves (past a
    # version manager's shim, which alone costs tens of milliseconds).
    python = resolve("python3", os.environ.get("PATH", os.defpath))
    spec = common_pb2.FunctionSpec(
        name="echo", command=[python, "-u", str(ECHO)], readiness_path="/healthz", egress=egress
    )
    spec.resources.memory_mib = 64
    return spec


async def _one(backend: ProcessBackend, n: int, egress: bool) -> float:
    t0 = time.perf_counter()
    sb = await backend.start("bench-0", f"i-{n}", _spec(egress))
    took = time.perf_counter() - t0
    await sb.stop()
    return took * 1000


async def run(rounds: int) -> dict[str, object]:
    """Start-to-ready times (ms) of the backends over rounds rounds:
    process, bwrap (a root agent's default: the entry enters by setns, and
    the instance gets a veth for routed connections), bwrap-relay (the
    same without routing), bwrap-factory (the socket factory an agent that
    is not root needs) and bwrap-egress (bwrap with the spec's ``egress``:
    slirp4netns beside it)."""
    routed = Routes(RoutePool(parse_subnet(DEFAULT_SUBNET), start=os.getpid()))  # type: ignore[arg-type]
    if routed.start("127.0.0.1") is not None:
        raise SystemExit("routed entries need a root agent with nftables")
    bwrap = BwrapBackend(cgroups=open_cgroups("auto", 1024), routes=routed)
    backends: dict[str, ProcessBackend] = {
        "process": ProcessBackend(cgroups=open_cgroups("auto", 1024)),
        "bwrap": bwrap,
        "bwrap-relay": BwrapBackend(cgroups=open_cgroups("auto", 1024)),
        "bwrap-factory": BwrapBackend(cgroups=open_cgroups("auto", 1024), entry="factory"),
        "bwrap-egress": bwrap,
    }
    times: dict[str, list[float]] = {k: [] for k in backends}
    try:
        for n in range(rounds):
            k = n % len(backends)
            order = list(backends)[k:] + list(backends)[:k]  # rotate
            for kind in order:
                times[kind].append(await _one(backends[kind], n, kind == "bwrap-egress"))
    finally:
        for b in set(backends.values()):
            await b.close()
        routed.stop()
    out: dict[str, object] = {}
    for kind, xs in times.items():
        xs.sort()
        out[kind] = {"p50_ms": statistics.median(xs), "p90_ms": xs[int(len(xs) * 0.9)]}
    base = statistics.median(times["process"])
    out["p50_added_ms"] = statistics.median(times["bwrap"]) - base
    out["p50_added_relay_ms"] = statistics.median(times["bwrap-relay"]) - base
    out["p50_added_factory_ms"] = statistics.median(times["bwrap-factory"]) - base
    out["p50_added_egress_ms"] = statistics.median(times["bwrap-egress"]) - base
    out["rounds"] = rounds
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: --rounds N."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40, help="starts per backend")
    args = p.parse_args(argv)
    json.dump(asyncio.run(run(args.rounds)), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
