"""Galaxy's version and the commit it was built from.

The version is the installed distribution's (pyproject.toml); the commit is
``$GALAXY_COMMIT`` when set (the container build sets it), else what git says
of the checkout the code runs from, else ``unknown``. Both appear in
``galaxy --version``, in every process's ``galaxy_build_info`` metric and in
``endpoints.json``, so an operator can tell which build each component runs
during a rolling upgrade (docs/operations.md).
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "galaxy-controlplane"


@functools.cache
def version() -> str:
    """The installed version, or ``0+unknown`` when not installed as a package."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def commit() -> str:
    """Short commit hash of the build (see the module docstring)."""
    env = os.environ.get("GALAXY_COMMIT", "").strip()
    if env:
        return env[:40]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def describe() -> str:
    """``galaxy X.Y.Z (commit C)``: the line ``galaxy --version`` prints."""
    return f"galaxy {version()} (commit {commit()})"
