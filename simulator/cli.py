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

from controlplane.runtime import config
from simulator.cliconfig import FidelityConfig, SimCalibrateConfig, SimulateConfig


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
        return commands.simulate(config.from_args(SimulateConfig, args))
    except (commands.UsageError, SpecError, TraceError, CalibrationError) as e:
        print(f"galaxy simulate: {e}", file=sys.stderr)
        return 2


async def cmd_fidelity(args: argparse.Namespace) -> int:
    """``galaxy simulate-fidelity``."""
    try:
        from simulator import fidelity
    except ModuleNotFoundError as e:
        return _needs_extra("simulate-fidelity", e)

    return await fidelity.main(config.from_args(FidelityConfig, args))


async def cmd_calibrate(args: argparse.Namespace) -> int:
    """``galaxy simulate-calibrate``."""
    try:
        from simulator import calibrate
    except ModuleNotFoundError as e:
        return _needs_extra("simulate-calibrate", e)

    return await calibrate.main(config.from_args(SimCalibrateConfig, args))


def add_subparser(sub: Any) -> None:
    """Register simulate, simulate-fidelity and simulate-calibrate (flags
    from ``simulator.cliconfig``)."""
    p = sub.add_parser("simulate", help="discrete-event simulation of Galaxy and baselines")
    config.add_arguments(p, SimulateConfig)
    p.set_defaults(func=cmd_simulate)

    f = sub.add_parser(
        "simulate-fidelity",
        help="run one scenario simulated and on a real emulated cluster; compare",
    )
    config.add_arguments(f, FidelityConfig)
    f.set_defaults(func=cmd_fidelity)

    c = sub.add_parser(
        "simulate-calibrate",
        help="measure the simulator's per-operation service times against the real services",
    )
    config.add_arguments(c, SimCalibrateConfig)
    c.set_defaults(func=cmd_calibrate)
