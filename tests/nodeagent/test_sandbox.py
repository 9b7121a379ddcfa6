"""Sandbox backends with real subprocesses (the echo server) and the emulated one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

from controlplane.nodeagent.sandbox import (
    EmulatedBackend,
    ProcessBackend,
    describe_exit,
    make_sandbox_backend,
)
from controlplane.runtime.errors import Unavailable
from galaxy.v1 import common_pb2

from .conftest import REPO, echo_spec, http, pid_gone, py_spec, wait_pid_exit

# Listens on $PORT and ignores SIGTERM: only SIGKILL ends it.
STUBBORN = (
    "import os, signal, socket, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(60)\n"
)


async def test_echo_server_ready_and_answers(process_backend):
    sb = await process_backend.start("n-0", "i-1", echo_spec())
    assert sb.running and sb.pid is not None
    assert sb.address.startswith("127.0.0.1:")
    assert await http(sb.address, "GET", "/healthz") == (200, b"ok")
    status, body = await http(sb.address, "POST", "/any/path", b"hello galaxy")
    assert status == 200
    reply = json.loads(body)
    assert reply == {
        "echo": "hello galaxy",
        "pid": sb.pid,
        "instance": "i-1",
        "function": "echo",
        "node": "n-0",
        "revision": 0,
    }
    await sb.stop()
    # SIGTERM is enough for the echo server: it exits cleanly with status 0.
    assert sb.returncode == 0
    assert pid_gone(sb.pid)
    assert not sb.running


async def test_tcp_readiness_without_path(process_backend):
    sb = await process_backend.start("n-0", "tcp", echo_spec(readiness_path=""))
    assert (await http(sb.address, "GET", "/healthz"))[0] == 200
    await sb.stop()


async def test_immediate_exit_fails_with_code_and_stderr(process_backend):
    code = "import sys; sys.stderr.write('boom: no model file\\n'); sys.exit(3)"
    with pytest.raises(Unavailable) as e:
        await process_backend.start("n-0", "dies", py_spec(code))
    msg = e.value.message
    assert "process exited with code 3 before it became ready" in msg
    assert "boom: no model file" in msg
    assert "dies" in msg and "n-0" in msg


async def test_command_not_found_is_unavailable(process_backend):
    spec = common_pb2.FunctionSpec(name="x", command=[str(REPO / "no-such-binary")])
    with pytest.raises(Unavailable, match="is not found or not executable"):
        await process_backend.start("n-0", "nf", spec)


async def test_never_listening_times_out_and_is_killed(process_backend):
    spec = py_spec("import time; time.sleep(60)", startup_timeout_ms=300)
    with pytest.raises(Unavailable, match="did not become ready within 300 ms"):
        await process_backend.start("n-0", "sleepy", spec)
    # The no_leaked_processes fixture checks the sleeper was killed and reaped.


async def test_readiness_waits_for_2xx(process_backend):
    # The echo server answers 404 on this path: never ready.
    spec = echo_spec(readiness_path="/not-health", startup_timeout_ms=400)
    with pytest.raises(Unavailable, match="GET /not-health answering 2xx"):
        await process_backend.start("n-0", "404", spec)


async def test_env_is_port_spec_env_and_agent_facts_only(process_backend, monkeypatch):
    monkeypatch.setenv("AGENT_PRIVATE", "must-not-leak")
    code = (
        "import os, sys\n"
        "for k in sorted(os.environ): sys.stderr.write(f'{k}={os.environ[k]}\\n')\n"
        "sys.exit(1)\n"
    )
    spec = py_spec(code, name="envfn", env={"FOO": "bar", "PORT": "1"})
    with pytest.raises(Unavailable) as e:
        await process_backend.start("n-7", "env-1", spec)
    assert "process exited with code 1" in e.value.message
    msg = (process_backend.log_dir / "n-7" / "env-1.err").read_text()  # all of it
    assert "FOO=bar" in msg
    assert "GALAXY_INSTANCE_ID=env-1" in msg and "GALAXY_FUNCTION=envfn" in msg
    assert "GALAXY_NODE_ID=n-7" in msg and "PATH=" in msg
    assert "PORT=1\n" not in msg and "PORT=" in msg  # the agent's port wins
    assert "AGENT_PRIVATE" not in msg
    # The private directory: $HOME, $TMPDIR and GALAXY_INSTANCE_DIR.
    home = msg.split("\nHOME=")[1].split("\n")[0]
    assert f"TMPDIR={home}\n" in msg and f"GALAXY_INSTANCE_DIR={home}\n" in msg
    assert home.endswith("/env-1")


async def test_a_version_managers_shim_is_skipped_for_the_interpreter_behind_it(
    process_backend, monkeypatch, tmp_path
):
    # A shim first on PATH that fails if run, then the real interpreter: the
    # instance runs the second, as a bwrap sandbox's would (one runtime, one
    # interpreter, whatever the sandbox).
    shims, real = tmp_path / "shims", tmp_path / "pfx" / "bin"
    shims.mkdir()
    real.mkdir(parents=True)
    (shims / "py").write_text("#!/bin/sh\necho shim ran >&2\nexit 9\n")
    (shims / "py").chmod(0o755)
    (real / "py").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{shims}:{real}:{os.environ.get('PATH', '')}")
    spec = py_spec("import sys; sys.stderr.write(sys.executable); sys.exit(4)", name="shim")
    spec.command[0] = "py"
    with pytest.raises(Unavailable, match="exited with code 4") as e:
        await process_backend.start("n-0", "shim-1", spec)
    assert "shim ran" not in e.value.message
    assert (process_backend.log_dir / "n-0" / "shim-1.err").read_text() == str(real / "py")


async def test_stop_escalates_to_sigkill(tmp_path):
    backend = ProcessBackend(log_dir=tmp_path, stop_grace_s=0.2)
    try:
        sb = await backend.start("n-0", "stubborn", py_spec(STUBBORN))
        await sb.stop()
        assert sb.returncode == -signal.SIGKILL
        assert pid_gone(sb.pid)
    finally:
        await backend.close()


@pytest.mark.slow
async def test_exit_callback_when_killed_externally(process_backend):
    exited: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    sb = await process_backend.start(
        "n-0", "victim", echo_spec(), on_exit=lambda i, rc: exited.set_result((i, rc))
    )
    os.kill(sb.pid, signal.SIGKILL)  # by PID only
    assert await asyncio.wait_for(exited, 5) == ("victim", -signal.SIGKILL)
    assert not sb.running
    await sb.stop()  # idempotent after exit


@pytest.mark.slow
async def test_no_exit_callback_for_deliberate_stop(process_backend):
    calls: list[int] = []
    sb = await process_backend.start(
        "n-0", "calm", echo_spec(), on_exit=lambda i, rc: calls.append(rc)
    )
    await sb.stop()
    await asyncio.sleep(0)  # let any (wrong) callback run
    assert calls == []


async def test_cancelled_start_leaves_nothing(process_backend):
    spec = py_spec("import time; time.sleep(60)", startup_timeout_ms=30_000)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(process_backend.start("n-0", "cancelled", spec), 0.3)
    # no_leaked_processes checks the child is gone.


async def test_close_stops_everything(tmp_path):
    backend = ProcessBackend(log_dir=tmp_path)
    sbs = await asyncio.gather(*(backend.start("n-0", f"c{i}", echo_spec()) for i in range(3)))
    assert len({sb.port for sb in sbs}) == 3
    await backend.close()
    assert all(pid_gone(sb.pid) for sb in sbs)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["setpriv", "python"])
async def test_instance_dies_with_its_agent_even_on_sigkill(tmp_path, launcher):
    """PR_SET_PDEATHSIG: a SIGKILLed agent leaves no instance behind, with
    either launcher (an empty PATH hides setpriv and forces the fallback)."""
    env = dict(os.environ)
    if launcher == "python":
        env["PATH"] = str(tmp_path)
    agent_code = (
        "import asyncio, sys\n"
        "from controlplane.nodeagent.sandbox import ProcessBackend\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'nodeagent')!r})\n"
        "from conftest import echo_spec\n"
        "async def main():\n"
        f"    b = ProcessBackend(log_dir={str(tmp_path)!r})\n"
        "    assert (b._prefix[0] == sys.executable) == (sys.argv[1] == 'python')\n"
        "    sb = await b.start('n-0', 'orphan', echo_spec())\n"
        "    print(sb.pid, flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        agent_code,
        launcher,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        line = await asyncio.wait_for(agent.stdout.readline(), 10)
        instance_pid = int(line)
        assert not pid_gone(instance_pid)
    finally:
        agent.kill()
        await agent.wait()
    await wait_pid_exit(instance_pid)


async def test_emulated_backend():
    exits: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    def on_exit(instance_id: str, rc: int) -> None:
        exits.put_nowait((instance_id, rc))

    backend = make_sandbox_backend("emulated", start_delay_ms=20)
    assert isinstance(backend, EmulatedBackend) and not backend.needs_command
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    sb = await backend.start("n-1", "e-1", common_pb2.FunctionSpec(name="f"), on_exit)
    assert loop.time() - t0 >= 0.02
    assert sb.address == "emulated://n-1/e-1" and sb.running and sb.pid is None
    sb.crash(7)
    assert await asyncio.wait_for(exits.get(), 1) == ("e-1", 7)
    assert not sb.running
    other = await backend.start("n-1", "e-2", common_pb2.FunctionSpec(name="f"), on_exit)
    await backend.close()
    assert not other.running and exits.empty()


def test_factory_and_exit_descriptions():
    assert make_sandbox_backend("process").kind == "process"
    with pytest.raises(ValueError, match="emulated, process"):
        make_sandbox_backend("docker")
    assert describe_exit(3) == "process exited with code 3"
    assert describe_exit(-9) == "process exited with code -9 (killed by SIGKILL)"
