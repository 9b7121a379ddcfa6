"""tests/clirun.py: the CLI run in the test process leaves the process as it
found it (the event loop policy, which the CLI sets to uvloop's)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.clirun import run_cli


# The first CLI call imports every command's modules: ~2 s quiet, over the
# fast bound on a loaded machine.
@pytest.mark.slow
def test_the_event_loop_policy_is_put_back(tmp_path: Path) -> None:
    before = asyncio.get_event_loop_policy()
    # No control plane there: the command fails fast, after installing uvloop.
    r = run_cli(["--run-dir", str(tmp_path / "none"), "status"])
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert asyncio.get_event_loop_policy() is before
