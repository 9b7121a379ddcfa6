"""The private directory's limit: how a tree is counted (blocks held, each
entry at least a block, the walk stopped past the limit, a directory its
instance closed opened again), which instances are over (pure), and the
watch killing one over its limit with its exit naming it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.nodeagent import diskwatch
from controlplane.nodeagent.diskwatch import BLOCK, MIB, DiskWatch, next_walk, over_limit, usage
from controlplane.nodeagent.sandbox.base import Sandbox
from galaxy.v1 import common_pb2


def test_a_file_counts_the_blocks_it_holds_not_its_length(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(os.urandom(3 * MIB))
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(10 << 30)  # 10 GiB long, nothing written
    n = usage(tmp_path, stop_above=1 << 40)
    assert 3 * MIB <= n < 4 * MIB


def test_empty_files_and_directories_count_a_block_each(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    for i in range(100):
        (deep / f"e{i}").touch()
    assert usage(tmp_path, stop_above=1 << 40) >= 102 * BLOCK


def test_the_walk_stops_once_past_the_limit(tmp_path: Path) -> None:
    for i in range(1000):
        (tmp_path / f"e{i}").touch()
    # Stopped at the first entry past 10 blocks, not after all 1,000.
    assert usage(tmp_path, stop_above=10 * BLOCK) == 11 * BLOCK


def test_a_directory_closed_by_its_owner_is_counted(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "data").write_bytes(os.urandom(2 * MIB))
    hidden.chmod(0)
    try:
        assert usage(tmp_path, stop_above=1 << 40) >= 2 * MIB
    finally:
        hidden.chmod(0o700)


def test_a_tree_that_is_gone_counts_nothing(tmp_path: Path) -> None:
    assert usage(tmp_path / "gone", stop_above=1) == 0


def test_over_limit_is_past_the_limit_and_never_without_one() -> None:
    used = {"a": 10, "b": 11, "c": 99, "d": 5}
    limits = {"a": 10, "b": 10, "c": 0}
    assert over_limit(used, limits) == {"b": (11, 10)}


class _Proc(Sandbox):
    """A real process in a group of its own, as the process sandbox starts one."""

    def __init__(self, private_dir: Path) -> None:
        super().__init__("node-0", "i-1", "127.0.0.1:1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        self.pid = self.proc.pid
        self.private_dir = private_dir

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    async def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class _Servicer:
    """What DiskWatch reads of the node agent's servicer."""

    def __init__(self, sandbox: Sandbox, disk_mib: int) -> None:
        spec = common_pb2.FunctionSpec(name="hog")
        spec.resources.disk_mib = disk_mib
        inst = type("I", (), {"instance_id": "i-1", "spec": spec, "sandbox": sandbox})()
        node = type("N", (), {"node_id": "node-0", "instances": {"i-1": inst}})()
        self.nodes = {"node-0": node}
        self.backend = None  # no log directory: nothing to prune


@pytest.mark.parametrize("spec_mib,default_mib,killed", [(1, 0, True), (0, 1, True), (0, 8, False)])
async def test_the_watch_kills_an_instance_over_its_limit(
    tmp_path: Path, spec_mib: int, default_mib: int, killed: bool
) -> None:
    (tmp_path / "hog").write_bytes(os.urandom(2 * MIB))
    sb = _Proc(tmp_path)
    try:
        before = diskwatch.KILLS._value.get()
        watch = DiskWatch(_Servicer(sb, spec_mib), default_mib)  # type: ignore[arg-type]
        assert await watch.check() == (["i-1"] if killed else [])
        if killed:
            assert await asyncio.to_thread(sb.proc.wait, 30) == -signal.SIGKILL
            assert sb.killed_for.startswith("out of disk: it kept 2 MiB or more")
            assert "past its limit of 1 MiB (resources.disk_mib)" in sb.killed_for
            assert diskwatch.KILLS._value.get() == before + 1
        else:
            assert sb.running and sb.killed_for == ""
    finally:
        await sb.stop()


def test_a_costly_tree_is_walked_again_later() -> None:
    # Within a share of a core: a 1 s walk waits 20 s, a quick one the period.
    assert next_walk(100.0, 2.0, 0.001) == 102.0
    assert next_walk(100.0, 2.0, 1.0) == pytest.approx(120.0)


async def test_a_tree_is_not_walked_again_before_it_is_due(tmp_path: Path) -> None:
    sb = _Proc(tmp_path)
    try:
        watch = DiskWatch(_Servicer(sb, 1), 0, period_s=60.0)  # type: ignore[arg-type]
        assert await watch.check() == []  # empty: under its 1 MiB
        (tmp_path / "hog").write_bytes(os.urandom(2 * MIB))
        assert await watch.check() == []  # over now, but not due for 60 s
        watch._due["i-1"] = 0.0
        assert await watch.check() == ["i-1"]
    finally:
        await sb.stop()
