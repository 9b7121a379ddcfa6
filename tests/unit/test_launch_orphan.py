"""The process sandbox's launcher: once the parent-death signal is set, the
instance's command runs only if its agent is still its parent; an agent
killed before the signal was set (which would then never come) leaves no
instance running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox.launch import orphan_check, pdeathsig_prefix


def test_the_command_runs_while_its_agent_is_its_parent(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = subprocess.run([*orphan_check(os.getpid()), "touch", str(marker)], timeout=30)
    assert r.returncode == 0 and marker.exists()


def test_an_orphan_exits_before_its_command(tmp_path: Path) -> None:
    # Its parent is this process, not the agent named: as if the agent had
    # died and the launcher had been given to another parent.
    marker = tmp_path / "ran"
    other = os.getppid()
    r = subprocess.run([*orphan_check(other), "touch", str(marker)], timeout=30)
    assert r.returncode == 125 and not marker.exists()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_setpriv_sets_the_signal_before_the_check() -> None:
    prefix = pdeathsig_prefix()
    assert prefix[prefix.index("--") + 1 :] == orphan_check(os.getpid())
    # What the instance's command sees: the parent-death signal set (KILL).
    get = (
        "import ctypes; v = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"
    )
    r = subprocess.run(
        [*prefix, sys.executable, "-c", get], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and r.stdout == f"{signal.SIGKILL.value}\n", r.stderr
