"""Process-sandbox isolation beyond CPU and memory: a pids limit that stops a
fork loop inside the instance, no file descriptor of the agent inherited,
and a private directory per instance. Real processes in real cgroups behind
a real gRPC agent (needs root for cgroups; in CI a missing cgroup filesystem
fails the test, elsewhere it skips, as in test_cgroups.py)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pwd
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.sandbox import ProcessBackend
from controlplane.nodeagent.sandbox.cgroups import CgroupError, Cgroups
from controlplane.nodeagent.sandbox.process import ProcessSandbox
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2, nodeagent_pb2

from .conftest import MakeAgent, echo_spec, http, py_spec

MAX_PIDS = 32
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by any user (a pyenv one may sit in /root)

# Ready at once (binds $PORT), then forks children that only wait, until a
# fork fails; reports how many it made and the errno on stderr, keeps serving.
FORK_LOOP = (
    "import os, socket, sys, time\n"
    "s = socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n"
    "n = 0\n"
    "while True:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError as e:\n"
    "        sys.stderr.write(f'forked {n} errno {e.errno}\\n'); sys.stderr.flush()\n"
    "        break\n"
    "    if pid == 0:\n"
    "        try:\n"
    "            time.sleep(3600)\n"
    "        finally:\n"
    "            os._exit(0)\n"
    "    n += 1\n"
    "time.sleep(3600)\n"
)

# Lists its open fds before anything else (as JSON on stderr), then serves.
LIST_FDS = (
    "import os, sys, json\n"
    "fds = {}\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        fds[fd] = os.readlink('/proc/self/fd/' + fd)\n"
    "    except OSError:\n"
    "        fds[fd] = None  # the listing's own fd, closed by now\n"
    "sys.stderr.write(json.dumps(fds) + '\\n'); sys.stderr.flush()\n"
    "import socket, time\n"
    "s = socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(3600)\n"
)

# Serves; its environment and cwd are read from /proc by the test.
SERVE = (
    "import os, socket, time\n"
    "s = socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(3600)\n"
)


def _cgroups_or_skip(max_pids: int) -> Cgroups:
    try:
        return Cgroups(max_pids=max_pids)
    except CgroupError as e:
        if os.environ.get("CI"):
            pytest.fail(f"cgroups unavailable in CI: {e}")
        pytest.skip(str(e))


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[ProcessBackend]:
    groups = _cgroups_or_skip(MAX_PIDS)
    b = ProcessBackend(log_dir=tmp_path / "logs", cgroups=groups, instance_dir=tmp_path / "inst")
    yield b
    await b.close()
    assert not any(p.exists() for p in groups.parents), "agent cgroups left behind"
    assert not any((tmp_path / "inst").iterdir()), "instance directories left behind"


def _sandbox(agent_backend: ProcessBackend, instance_id: str) -> ProcessSandbox:
    (sb,) = [s for s in agent_backend._live if s.instance_id == instance_id]
    return sb


async def _stderr_line(path: Path, prefix: str, within_s: float = 20.0) -> str:
    """The first stderr line starting with prefix (polled with a deadline:
    a log file gives no event when written)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        for line in (await asyncio.to_thread(path.read_text)).splitlines():
            if line.startswith(prefix):
                return line
        await asyncio.sleep(0.02)
    text = await asyncio.to_thread(path.read_text)
    raise AssertionError(f"no {prefix!r} line in {path}: {text!r}")


def _hits() -> float:
    return REGISTRY.get_sample_value("galaxy_instance_pids_limit_hits_total") or 0.0


@pytest.mark.slow  # a real fork loop in a real cgroup, stopped at its pids limit
async def test_fork_loop_stops_at_the_pids_limit_and_the_agent_stays_healthy(
    backend: ProcessBackend, make_agent: MakeAgent
) -> None:
    agent = await make_agent([("n-0", Res(4000, 4096, 0))], backend)
    spec = py_spec(FORK_LOOP, name="forker", resources=common_pb2.Resources(memory_mib=256))
    hits_before = _hits()
    await agent.stub.CreateInstance(
        nodeagent_pb2.CreateInstanceRequest(node_id="n-0", instance_id="fork-1", function=spec)
    )
    sb = _sandbox(backend, "fork-1")
    assert sb.group is not None and sb.group.pids_dir is not None
    assert int((sb.group.pids_dir / "pids.max").read_text()) == MAX_PIDS
    line = await _stderr_line(sb.stderr_path, "forked ")
    _, count, _, err = line.split()
    print(f"fork loop: {count} children at pids.max {MAX_PIDS}")
    # The leader is one task of the MAX_PIDS; every child another.
    assert 0 < int(count) <= MAX_PIDS - 1 and int(err) == errno.EAGAIN
    assert int(count) >= MAX_PIDS - 2  # the limit stopped it, nothing else
    assert sb.group.pids_limit_hits() >= 1
    assert len(sb.group.procs()) == int(count) + 1
    # The agent still answers, and the node can still start processes.
    probe = await agent.stub.Probe(nodeagent_pb2.ProbeRequest(node_id="n-0"))
    assert probe.status.instances == 1
    reply = await agent.stub.CreateInstance(
        nodeagent_pb2.CreateInstanceRequest(
            node_id="n-0", instance_id="echo-1", function=echo_spec()
        )
    )
    assert (await http(reply.instance.address, "GET", "/healthz"))[0] == 200
    # Stopping ends the instance and all its children; the group goes.
    dirs = list(sb.group.dirs)
    await agent.stub.DeleteInstance(
        nodeagent_pb2.DeleteInstanceRequest(node_id="n-0", instance_id="fork-1")
    )
    assert not any(d.exists() for d in dirs), "fork loop's cgroup left after stop"
    assert _hits() == hits_before + 1


async def test_instance_inherits_no_fd_of_the_agent(
    backend: ProcessBackend, make_agent: MakeAgent
) -> None:
    # Descriptors that a careless spawn would pass on: an inheritable pipe
    # (as the lifeline is), besides the agent's gRPC server and client sockets.
    r, w = os.pipe()
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)
    try:
        agent = await make_agent([("n-0", Res(4000, 4096, 0))], backend)
        await agent.stub.CreateInstance(
            nodeagent_pb2.CreateInstanceRequest(
                node_id="n-0", instance_id="fds-1", function=py_spec(LIST_FDS, name="fds")
            )
        )
        sb = _sandbox(backend, "fds-1")
        fds: dict[str, str | None] = json.loads(await _stderr_line(sb.stderr_path, "{"))
    finally:
        os.close(r)
        os.close(w)
    extra = {fd: target for fd, target in fds.items() if fd not in ("0", "1", "2")}
    assert list(extra.values()) == [None], f"inherited: {extra}"  # only the listing's own
    assert fds["0"] == "/dev/null"  # never the agent's stdin (its lifeline pipe)
    assert fds["1"].endswith("/n-0/fds-1.out") and fds["2"].endswith("/n-0/fds-1.err")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if kv)


async def test_each_instance_gets_a_private_directory_removed_when_it_ends(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    a = await backend.start("n-0", "dir-a", py_spec(SERVE, name="a"))
    b = await backend.start("n-0", "dir-b", py_spec(SERVE, name="b", workdir=str(code_dir)))
    try:
        da, db = a.private_dir, b.private_dir
        assert da is not None and db is not None and da != db
        for d in (da, db):
            assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700
            assert d.is_relative_to(tmp_path / "inst")
        ea, eb = _environ(a.pid or 0), _environ(b.pid or 0)
        assert ea["HOME"] == ea["TMPDIR"] == ea["GALAXY_INSTANCE_DIR"] == str(da)
        assert eb["HOME"] == eb["TMPDIR"] == str(db)
        # No spec workdir: the private directory is the cwd; with one, it is kept.
        assert os.readlink(f"/proc/{a.pid}/cwd") == str(da)
        assert os.readlink(f"/proc/{b.pid}/cwd") == str(code_dir)
    finally:
        await a.stop()
    assert not da.exists() and db.exists()
    await b.stop()
    assert not db.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root agent")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs the system python3")
async def test_private_directory_belongs_to_the_instance_user_only(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    other = pwd.getpwnam("daemon")  # any other unprivileged user on the node
    backend = ProcessBackend(
        log_dir=tmp_path / "logs", user="nobody", instance_dir=tmp_path / "inst"
    )
    spec = common_pb2.FunctionSpec(name="u", command=[SYSTEM_PYTHON, "-c", SERVE])
    try:
        sb = await backend.start("n-0", "owned", spec)
        d = sb.private_dir
        assert d is not None
        st = d.stat()
        assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)
        assert stat.S_IMODE(st.st_mode) == 0o700
        assert os.readlink(f"/proc/{sb.pid}/cwd") == str(d)  # reachable by nobody
        # Another user cannot list it (nor, with 0711 parents, list its siblings).
        probe = [SYSTEM_PYTHON, "-c", "import os, sys; os.listdir(sys.argv[1])"]
        for target in (d, d.parent):
            denied = await asyncio.to_thread(
                subprocess.run,
                ["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}",
                 "--clear-groups", *probe, str(target)],
                capture_output=True,
            )  # fmt: skip
            assert denied.returncode != 0 and b"PermissionError" in denied.stderr
    finally:
        await backend.close()
    assert not any((tmp_path / "inst").iterdir())
