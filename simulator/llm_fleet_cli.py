"""The LLM fleet simulation's command line and table (``simulator.llm_fleet``).

python -m simulator.llm_fleet_cli --minutes 4 --speed 15
python -m simulator.llm_fleet_cli --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from simulator.llm_fleet import FleetSim, Outcome, policies
from simulator.llm_fleet_workload import LARGE, FleetShape, workload


def table(outs: list[Outcome], base: str = "knative") -> str:
    """Markdown rows: TTFT p50/p99, goodput, GPU-seconds, loads, ratios."""
    ref = next(o for o in outs if o.policy == base)
    rows = [
        "| policy | done | refused | TTFT p50 s | TTFT p99 s | goodput req/s | good % "
        f"| GPU-s | cold loads | warm loads | goodput vs {base} | GPU-s vs {base} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outs:
        rows.append(
            f"| {o.policy} | {o.done} | {o.refused} | {o.ttft_pct(50):.2f} | "
            f"{o.ttft_pct(99):.2f} | {o.goodput:.1f} | {o.good / max(1, o.requests):.0%} | "
            f"{o.gpu_s:.0f} | {o.cold_loads} | {o.warm_loads} | "
            f"{o.goodput / ref.goodput:.2f}x | {o.gpu_s / ref.gpu_s:.2f}x |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the three policies on one workload; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m simulator.llm_fleet_cli", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="24 nodes, 2 minutes, 12 functions")
    ap.add_argument("--nodes", type=int, default=210)
    ap.add_argument("--functions", type=int, default=60)
    ap.add_argument("--minutes", type=float, default=4.0, help="simulated minutes of trace")
    ap.add_argument("--speed", type=float, default=15.0, help="time compression of the trace")
    ap.add_argument("--zipf", type=float, default=1.0, help="function popularity skew")
    ap.add_argument("--target", type=float, default=16.0, help="per-instance scaling target")
    ap.add_argument("--decision-ms", type=float, default=1.0, help="cost of one LLM pick")
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="also galaxy with least_loaded placement (what model locality adds)",
    )
    ap.add_argument(
        "--max-asleep",
        type=int,
        default=0,
        help="also galaxy keeping this many idle instances of a function asleep",
    )
    ap.add_argument("--keep-asleep-s", type=float, default=300.0)
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.minutes, a.functions, a.speed = 24, 2.0, 12, 6.0
    positive = ("nodes", "functions", "minutes", "speed", "zipf", "target", "ttft_ms", "tpot_ms")
    bad = [n for n in positive if getattr(a, n) <= 0] + (
        ["decision_ms"] if a.decision_ms < 0 else []
    )
    bad += ["max_asleep"] if a.max_asleep < 0 else []
    bad += ["keep_asleep_s"] if a.keep_asleep_s < 0 else []
    if bad:
        ap.error(
            f"--{bad[0].replace('_', '-')} must be > 0 "
            "(--decision-ms, --max-asleep, --keep-asleep-s >= 0)"
        )
    shape = FleetShape(nodes=a.nodes)
    jobs = workload(a.minutes, a.functions, a.speed, a.zipf, a.seed)
    slo = (a.ttft_ms / 1000, a.tpot_ms / 1000)
    stacks = policies(*slo, a.target)
    if a.ablate:
        blind = dataclasses.replace(stacks[0], name="galaxy, least_loaded placement")
        stacks.append(dataclasses.replace(blind, placement="least_loaded"))
    if a.max_asleep:
        sleepy = f"galaxy, max_asleep {a.max_asleep}"
        stacks.append(
            dataclasses.replace(
                stacks[0], name=sleepy, max_asleep=a.max_asleep, keep_asleep_s=a.keep_asleep_s
            )
        )
    outs = [
        FleetSim(p, a.functions, LARGE, shape, slo, a.decision_ms / 1000, seed=a.seed).run(jobs)
        for p in stacks
    ]
    print(
        f"azure llm 2023 code+conv: {len(jobs)} requests, {a.minutes:g} min at {a.speed:g}x, "
        f"{a.functions} functions (zipf {a.zipf:g}), {a.nodes} nodes x {shape.gpus_per_node} "
        f"GPUs, {LARGE.name}, decision {a.decision_ms:g} ms, seed {a.seed}"
    )
    print(table(outs))
    for o in outs:
        if o.wakes:
            print(f"{o.policy}: {o.wakes} sleeping instances woken instead of started")
    return 0


if __name__ == "__main__":
    sys.exit(main())
