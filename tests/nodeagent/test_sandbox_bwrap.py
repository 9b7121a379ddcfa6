"""The bubblewrap backend with real sandboxes (bwrap, setpriv, cgroups when
writable): what an instance sees and may do, from inside; the uid pool;
a polite stop. The escape suite (tests/security/test_escape.py) checks the
same boundaries under a whole `galaxy up`."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox import BwrapBackend, make_sandbox_backend
from controlplane.nodeagent.sandbox.bwrap import runtime_roots
from controlplane.nodeagent.sandbox.launch import resolve
from controlplane.nodeagent.sandbox.uidpool import UidPool, UidPoolExhausted
from controlplane.runtime.errors import Unavailable

from .conftest import echo_spec, http, py_spec

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

# Reports, as the answer to any request, what it sees from inside.
REPORTER = (
    "import json, os, subprocess, http.server\n"
    "def status():\n"
    "    return dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
    " if ':\\t' in l)\n"
    "def tried(argv):\n"
    "    try:\n"
    "        return subprocess.run(argv, capture_output=True).returncode\n"
    "    except OSError as e:\n"
    "        return type(e).__name__\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        st = status()\n"
    "        doc = {'uid': os.getuid(), 'cap': st['CapEff'].strip(),\n"
    "               'nnp': st['NoNewPrivs'].strip(), 'pids': [p for p in os.listdir('/proc')"
    " if p.isdigit()],\n"
    "               'root': sorted(os.listdir('/')), 'cwd': os.getcwd(),\n"
    "               'unshare': tried(['unshare', '--user', 'true']),\n"
    "               'tmp': os.listdir('/tmp'),\n"
    "               'sys': [d for d in ('/sys/class', '/sys/kernel/mm/transparent_hugepage',"
    " '/sys/kernel/security', '/sys/kernel/debug', '/sys/fs', '/sys/block',"
    " '/sys/devices/virtual', '/sys/devices/system/cpu', '/sys/devices/system/node')"
    " if os.path.exists(d)],\n"
    "               'kernel': sorted(os.listdir('/sys/kernel')) if os.path.isdir('/sys/kernel')"
    " else []}\n"
    "        body = json.dumps(doc).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()\n"
)


@pytest.fixture
async def bwrap_backend(tmp_path):
    b = BwrapBackend(
        log_dir=tmp_path / "logs",
        instance_dir=tmp_path / "inst",
        uid_pool=UidPool(lock_dir=tmp_path / "uids") if os.geteuid() == 0 else None,
    )
    yield b
    await b.close()


async def test_the_default_backend_is_bwrap():
    from controlplane.nodeagent.config import NodeAgentConfig

    assert NodeAgentConfig().sandbox == "bwrap"
    b = make_sandbox_backend("bwrap")
    assert isinstance(b, BwrapBackend)
    await b.close()


async def test_an_instance_sees_only_itself(bwrap_backend, tmp_path):
    a = await bwrap_backend.start("n-0", "a", py_spec(REPORTER, readiness_path=""))
    b = await bwrap_backend.start("n-0", "b", py_spec(REPORTER, readiness_path=""))
    try:
        status, body = await http(a.address, "GET", "/")
        assert status == 200
        doc = json.loads(body)
        other = json.loads((await http(b.address, "GET", "/"))[1])
        assert int(doc["cap"], 16) == 0 and doc["nnp"] == "1"
        if os.geteuid() == 0:
            assert doc["uid"] != 0 and doc["uid"] != other["uid"]
            assert {a.uid, b.uid} == {doc["uid"], other["uid"]}
        assert len(doc["pids"]) <= 3  # its init, itself, the child it just ran
        assert doc["unshare"] != 0  # seccomp: no new namespaces
        # A private /tmp: nothing of the host's, only the way down to its
        # own directory and to its interpreter when they lie under /tmp (a
        # CI clone's virtualenv may).
        under = {
            Path(p).parts[2]
            for p in (str(a.private_dir), *runtime_roots(py_spec(REPORTER).command[0]))
            if str(p).startswith("/tmp/")
        }
        assert set(doc["tmp"]) == under
        assert doc["cwd"] == str(a.private_dir)
        # The system's programs and a few /etc files, and the top of the
        # interpreter's prefixes (here perhaps /root, for a pyenv Python).
        shown = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin"}
        shown |= {"tmp", "usr", *(Path(r).parts[1] for r in runtime_roots(sys.executable))}
        shown.add("sys")  # only the CPU and NUMA topology and the huge page settings:
        assert set(doc["root"]) <= shown, doc["root"]
        thp = "/sys/kernel/mm/transparent_hugepage"
        assert set(doc["sys"]) <= {"/sys/devices/system/cpu", "/sys/devices/system/node", thp}
        assert set(doc["kernel"]) <= {"mm"}
        assert (thp in doc["sys"]) == HOST_THP  # read by glibc's hugetlb tunable
        assert "var" not in doc["root"] and "home" not in doc["root"]
    finally:
        await a.stop()
        await b.stop()
    # SIGTERM reached the function (no handler: it died of it, which bwrap
    # reports as 128 + 15), not only bwrap; 137 would be the SIGKILL after
    # the grace period.
    assert a.returncode == 128 + 15


# Creates a POSIX shared memory segment (as vLLM's engine does), then
# answers with what /dev/shm holds and the CPUs /sys says are online (what
# lscpu reads; vLLM's CPU backend binds its threads by it).
SHM = (
    "import json, os, http.server\n"
    "from multiprocessing import shared_memory\n"
    "seg = shared_memory.SharedMemory(name='galaxy-' + os.environ['GALAXY_INSTANCE_ID'],"
    " create=True, size=4096)\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        cpus = open('/sys/devices/system/cpu/online').read().strip()\n"
    "        body = json.dumps([sorted(os.listdir('/dev/shm')), cpus]).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()\n"
)


#: the host's online CPUs, as the sandbox must show them
ONLINE = Path("/sys/devices/system/cpu/online").read_text().strip()
HOST_THP = Path("/sys/kernel/mm/transparent_hugepage").is_dir()


async def test_shared_memory_is_private_and_cpu_topology_shown(bwrap_backend):
    a = await bwrap_backend.start("n-0", "sa", py_spec(SHM, readiness_path=""))
    b = await bwrap_backend.start("n-0", "sb", py_spec(SHM, readiness_path=""))
    try:
        # Each could create its segment (bwrap's own /dev/shm is root's,
        # 0755: shm_open failed with EACCES) and sees only its own.
        assert json.loads((await http(a.address, "GET", "/"))[1]) == [["galaxy-sa"], ONLINE]
        assert json.loads((await http(b.address, "GET", "/"))[1]) == [["galaxy-sb"], ONLINE]
    finally:
        await a.stop()
        await b.stop()


async def test_echo_server_drains_on_stop_with_its_own_status(bwrap_backend):
    sb = await bwrap_backend.start("n-0", "e", echo_spec())
    assert (await http(sb.address, "GET", "/healthz")) == (200, b"ok")
    await sb.stop()
    assert sb.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid pool is a root agent's")
async def test_uids_go_back_to_the_pool(bwrap_backend):
    pool = bwrap_backend.uid_pool
    assert pool is not None
    sb = await bwrap_backend.start("n-0", "u", echo_spec())
    uid = sb.uid
    assert uid is not None and pool.base <= uid < pool.base + pool.size
    assert (os.stat(sb.private_dir).st_uid, os.stat(sb.private_dir).st_mode & 0o777) == (uid, 0o700)
    await sb.stop()
    assert uid not in pool._held


def test_uid_pool_is_shared_across_processes_by_locks(tmp_path):
    one, two = (
        UidPool(base=5000, size=2, lock_dir=tmp_path),
        UidPool(base=5000, size=2, lock_dir=tmp_path),
    )
    got = {one.acquire(), two.acquire()}
    assert got == {5000, 5001}
    with pytest.raises(UidPoolExhausted):
        one.acquire()
    one.close()  # releases its uid: the other pool may take it now
    assert two.acquire() in {5000, 5001}
    two.close()


async def test_a_missing_interpreter_is_named(bwrap_backend):
    spec = py_spec("pass")
    spec.command[0] = "/nonexistent/python3"
    with pytest.raises(Unavailable, match="nonexistent"):
        await bwrap_backend.start("n-0", "x", spec)


def test_interpreter_resolution_skips_shims_and_shows_prefixes(tmp_path):
    shims, real = tmp_path / "shims", tmp_path / "pfx" / "bin"
    shims.mkdir()
    real.mkdir(parents=True)
    for d in (shims, real):
        exe = d / "py"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    assert resolve("py", f"{shims}:{real}") == str(real / "py")
    assert runtime_roots(str(real / "py")) == [str(tmp_path / "pfx")]
    assert runtime_roots(sys.executable)  # the venv and the base interpreter
    assert all(Path(r).is_dir() for r in runtime_roots(sys.executable))
