"""The memory tier's directories on /dev/shm: a killed supervisor's is
removed by the next `galaxy up`, a live one's and an unknown one are kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.launch import agentcache

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")


@pytest.fixture
def made() -> Iterator[list[Path]]:
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _dir(made: list[Path], owner: str | None) -> Path:
    d = Path("/dev/shm") / f"galaxy-models-test{uuid.uuid4().hex[:8]}"
    d.mkdir()
    (d / "agent-0").mkdir()
    if owner is not None:
        (d / agentcache.OWNER).write_text(owner)
    made.append(d)
    return d


def test_a_dead_owners_directory_is_removed_and_others_kept(
    made: list[Path], tmp_path: Path
) -> None:
    # A process that has exited: its pid and start time, read while it lived.
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE)  # fmt: skip
    start = agentcache._process_start(p.pid)
    assert start is not None
    p.communicate(b"")
    dead = _dir(made, f"{p.pid} {start}\n")
    alive = _dir(made, f"{os.getpid()} {agentcache._process_start(os.getpid())}\n")
    unknown = _dir(made, None)
    garbled = _dir(made, "not a pid\n")

    agentcache.claim(tmp_path / "run")

    assert not dead.exists()
    assert alive.exists() and unknown.exists() and garbled.exists()
    mine = agentcache.shm_dir(tmp_path / "run")
    assert mine is not None
    made.append(mine)
    owner = (mine / agentcache.OWNER).read_text().split()
    assert owner == [str(os.getpid()), agentcache._process_start(os.getpid())]


def test_a_reused_pid_does_not_keep_a_dead_owners_directory(
    made: list[Path], tmp_path: Path
) -> None:
    # Our own pid with another start time: the pid was reused.
    stale = _dir(made, f"{os.getpid()} 1\n")
    agentcache.claim(tmp_path / "run")
    made.append(agentcache.shm_dir(tmp_path / "run"))  # type: ignore[arg-type]
    assert not stale.exists()
