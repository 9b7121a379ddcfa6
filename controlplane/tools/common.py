"""What the `galaxy` commands share: user-facing errors and finding the
control plane to talk to."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from controlplane.launch.up import read_endpoints


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 1."""


def find_controller(args: argparse.Namespace) -> str:
    """--controller, else $GALAXY_CONTROLLER, else the running `galaxy up`."""
    if getattr(args, "controller", None):
        return str(args.controller)
    if os.environ.get("GALAXY_CONTROLLER"):
        return os.environ["GALAXY_CONTROLLER"]
    ep = read_endpoints(Path(args.run_dir))
    if ep and ep.get("controller"):
        return str(ep["controller"])
    raise CliError(
        f"no running control plane found in {args.run_dir}; start one with `galaxy up` "
        "or pass --controller HOST:PORT"
    )
