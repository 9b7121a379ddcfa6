"""Instances run in their own cgroups with their spec's CPU and memory as
hard limits; an instance over its memory limit is ended by the kernel and
reported as such; the groups go when the instances do. Real processes, real
cgroups (needs root; in CI a missing cgroup filesystem fails the test)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox import ProcessBackend
from controlplane.nodeagent.sandbox.cgroups import CgroupError, Cgroups, open_cgroups
from tests.nodeagent.conftest import cgroups_or_skip, echo_spec, no_groups_left

# Binds $PORT (ready), then allocates far beyond its limit.
HOG = (
    "import os, socket, time\n"
    "s = socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(0.3)\n"
    "blocks = [bytearray(16 << 20) for _ in range(64)]\n"
    "time.sleep(30)\n"
)


@pytest.fixture
async def backend(tmp_path: Path):
    groups = cgroups_or_skip()
    b = ProcessBackend(log_dir=tmp_path, cgroups=groups)
    yield b
    await b.close()
    no_groups_left(groups)


def _cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


async def test_instance_runs_under_its_spec_limits(backend: ProcessBackend) -> None:
    spec = echo_spec()
    spec.resources.cpu_millis = 250
    spec.resources.memory_mib = 64
    sb = await backend.start("n-0", "lim-1", spec)
    try:
        assert sb.group is not None
        assert "galaxy/" in _cgroup_of(sb.pid or 0) and "lim-1" in _cgroup_of(sb.pid or 0)
        groups = backend.cgroups
        assert groups is not None
        if groups.version == 2:
            d = sb.group.dirs[0]
            assert (d / "cpu.max").read_text().split() == ["2500", "10000"]
            assert int((d / "memory.max").read_text()) == 64 << 20
        else:
            cpu, mem = sb.group.dirs
            assert int((cpu / "cpu.cfs_quota_us").read_text()) == 2500
            assert int((cpu / "cpu.cfs_period_us").read_text()) == 10_000
            assert int((mem / "memory.limit_in_bytes").read_text()) == 64 << 20
        dirs = list(sb.group.dirs)
    finally:
        await sb.stop()
    assert not any(d.exists() for d in dirs), "instance cgroup left after stop"


async def test_memory_hog_is_killed_and_reported_as_out_of_memory(
    backend: ProcessBackend,
) -> None:
    spec = echo_spec()
    spec.command[:] = [sys.executable, "-c", HOG]
    spec.readiness_path = ""
    spec.resources.memory_mib = 48
    ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    sb = await backend.start(
        "n-0", "hog-1", spec, on_exit=lambda iid, rc: ended.done() or ended.set_result(rc)
    )
    rc = await asyncio.wait_for(ended, 30)
    assert rc == -9  # SIGKILL from the OOM killer
    assert sb.oom_killed
    reason = sb.exit_reason(rc)
    assert "out of memory" in reason and "48 MiB" in reason and "resources.memory_mib" in reason


async def test_groups_of_agents_that_are_gone_are_swept(tmp_path: Path) -> None:
    try:
        Cgroups()  # only to know whether cgroups can be made here
    except CgroupError as e:
        if os.environ.get("CI"):
            pytest.fail(f"cgroups unavailable in CI: {e}")
        pytest.skip(str(e))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()  # its pid now names no running process
    dead = proc.pid
    first = Cgroups()
    stale = [p.parent / str(dead) for p in first.parents]
    for d in stale:
        (d / "inst-1").mkdir(parents=True)  # what a killed agent leaves
    first.close()
    second = Cgroups()  # a new agent sweeps them
    try:
        assert not any(d.exists() for d in stale)
    finally:
        second.close()


def test_a_process_left_in_a_gone_agents_group_is_killed(tmp_path: Path) -> None:
    """An instance its parent-death signal missed (its agent killed before
    the signal was set) outlives its agent: the next agent kills it by the
    pids its group lists, and removes the group."""
    try:
        Cgroups()
    except CgroupError as e:
        if os.environ.get("CI"):
            pytest.fail(f"cgroups unavailable in CI: {e}")
        pytest.skip(str(e))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no running process
    first = Cgroups()
    stale = [p.parent / str(gone.pid) / "inst-1" for p in first.parents]
    orphan = subprocess.Popen(["sleep", "60"])
    try:
        for d in stale:
            d.mkdir(parents=True)
            (d / "cgroup.procs").write_text(str(orphan.pid))
        first.close()
        Cgroups().close()  # a new agent: kills the orphan
        assert orphan.wait(30) == -signal.SIGKILL
        Cgroups().close()  # and the group goes (here, or at the next sweep)
        assert not any(d.parent.exists() for d in stale)
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_missing_pids_controller_warns_on_auto_and_is_refused_on_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A v1 layout with cpu and memory but no pids hierarchy (a tmp dir: the
    # real one has all three here).
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    (tmp_path / "memory").mkdir()
    with pytest.raises(CgroupError, match="pids"):
        open_cgroups("on", max_pids=64, root=tmp_path)
    groups = open_cgroups("auto", max_pids=64, root=tmp_path)
    try:
        assert groups is not None and groups.max_pids == 0  # cpu and memory still limited
        assert len(groups.parents) == 2
        warned = [r.getMessage() for r in caplog.records if "pids limit" in r.getMessage()]
        assert len(warned) == 1 and "--instance-max-pids" in warned[0]
    finally:
        if groups is not None:
            groups.close()
    assert open_cgroups("on", max_pids=0, root=tmp_path) is not None  # 0: no pids needed
