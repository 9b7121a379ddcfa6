"""Command line of the simulator, registered on the main ``galaxy`` CLI.

    galaxy simulate --nodes 210 --workload azure2019 --systems galaxy,knative --out DIR
    galaxy simulate --experiment overall --out DIR
    galaxy simulate-fidelity --out DIR
    galaxy simulate-calibrate --out calibration.json

(``galaxy calibrate`` is the controller's T_DF/T_SF/T_CMF measurement,
``controlplane.tools.calibrate``; this one measures per-operation service times.)

Wire it with ``simulator.cli.add_subparser(sub)`` next to the other
sub-commands. Heavy modules are imported when a command runs, not here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _needs_extra(command: str, error: ModuleNotFoundError) -> int:
    """Exit 2 with the extra to install when ``error`` is an optional package
    (numpy, matplotlib); re-raise anything else."""
    from controlplane.runtime.extras import missing_from

    missing = missing_from(error, f"galaxy {command}")
    if missing is None:
        raise error
    print(f"galaxy {command}: {missing}", file=sys.stderr)
    return 2


async def cmd_simulate(args: argparse.Namespace) -> int:
    """``galaxy simulate``."""
    try:
        from simulator import commands
        from simulator.calibration import CalibrationError
        from simulator.experiments import SpecError
        from simulator.traces import TraceError
    except ModuleNotFoundError as e:
        return _needs_extra("simulate", e)

    try:
        return commands.simulate(args)
    except (commands.UsageError, SpecError, TraceError, CalibrationError) as e:
        print(f"galaxy simulate: {e}", file=sys.stderr)
        return 2


async def cmd_fidelity(args: argparse.Namespace) -> int:
    """``galaxy simulate-fidelity``."""
    try:
        from simulator import fidelity
    except ModuleNotFoundError as e:
        return _needs_extra("simulate-fidelity", e)

    return await fidelity.main(args)


async def cmd_calibrate(args: argparse.Namespace) -> int:
    """``galaxy simulate-calibrate``."""
    try:
        from simulator import calibrate
    except ModuleNotFoundError as e:
        return _needs_extra("simulate-calibrate", e)

    return await calibrate.main(args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=1, help="seed of every random stream (1)")
    p.add_argument(
        "--calibration", default=None, help="calibration JSON (default: the shipped one)"
    )


def add_subparser(sub: Any) -> None:
    """Register simulate, simulate-fidelity and simulate-calibrate."""
    p = sub.add_parser("simulate", help="discrete-event simulation of Galaxy and baselines")
    p.add_argument("--nodes", type=int, default=210, help="worker nodes (210)")
    p.add_argument(
        "--workload",
        help="azure2019[:minutes=N], azure2021, llm2023, poisson:rate=R,duration=S, "
        "gamma:rate=R,shape=K, bursty:duration=S, or an experiment file (.yaml)",
    )
    p.add_argument(
        "--systems",
        default="galaxy,knative,sparrow,ray,atoll",
        help="comma list of galaxy, G1, Gn, Gn-C, knative, sparrow, ray, atoll",
    )
    p.add_argument(
        "--experiment",
        help="run a documented experiment: overall, scalability, ablation, cluster-size, "
        "sensitivity",
    )
    p.add_argument("--quick", action="store_true", help="a smaller version of --experiment")
    p.add_argument("--out", required=True, help="directory for report.md, results.json, PNGs")
    p.add_argument("--network", default="datacenter", help="datacenter (default) or loopback")
    p.add_argument(
        "--keep-alive", type=float, default=0.0, help="fixed keep-alive seconds (0: KPA grace)"
    )
    p.add_argument("--until", type=float, default=None, help="stop at this simulated time (s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=cmd_simulate)

    f = sub.add_parser(
        "simulate-fidelity",
        help="run one scenario simulated and on a real emulated cluster; compare",
    )
    f.add_argument("--nodes", type=int, default=210)
    f.add_argument("--out", required=True, help="directory for fidelity.json and report.md")
    f.add_argument(
        "--real",
        default=None,
        help="reuse a real-cluster result (fidelity.json) instead of starting a cluster",
    )
    f.add_argument(
        "--quick",
        action="store_true",
        help="fewer requests: a smoke test of the command, too few samples to judge p99",
    )
    f.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="real runs; each metric's median sim/real ratio is judged (3)",
    )
    f.add_argument("--seed", type=int, default=1, help="seed of every random stream (1)")
    f.add_argument(
        "--calibration",
        default="measure",
        help="'measure' (default: calibrate on this machine just before the real run), "
        "'shipped' (the calibration shipped with the package), or a calibration JSON",
    )
    f.set_defaults(func=cmd_fidelity)

    c = sub.add_parser(
        "simulate-calibrate",
        help="measure the simulator's per-operation service times against the real services",
    )
    c.add_argument("--out", required=True, help="calibration JSON to write")
    c.add_argument("--nodes", type=int, default=210)
    c.add_argument("--quick", action="store_true", help="fewer requests (less precise)")
    c.add_argument("--repeat", type=int, default=3, help="bench runs; each op's median is kept (3)")
    c.set_defaults(func=cmd_calibrate)
