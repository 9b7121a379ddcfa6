"""Fixtures for node agent tests: real subprocesses, real gRPC on loopback,
and the real Controller/ClusterMgr/Schedule/Dispatch as peers (peers.py).

Every test is checked for leaked child processes (read from /proc, so a
process the code under test forgot is found even if nothing tracks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from controlplane.nodeagent.registration import Registrar
from controlplane.nodeagent.sandbox import EmulatedBackend, ProcessBackend, SandboxBackend
from controlplane.nodeagent.sandbox.cgroups import CgroupError, Cgroups
from controlplane.nodeagent.service import SERVICE_NAME, NodeAgentServicer
from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2, nodeagent_pb2_grpc

if TYPE_CHECKING:
    from .peers import Peers

REPO = Path(__file__).resolve().parents[2]
ECHO = [sys.executable, str(REPO / "examples" / "echo_server.py")]


def child_pids() -> set[int]:
    """Direct children of this process (zombies included: unreaped is a leak)."""
    me = os.getpid()
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 4 is the ppid; the command name (field 2) may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            out.add(int(d))
    return out


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def wait_pid_exit(pid: int, within_s: float = 5.0) -> None:
    """Await the exit of any process (not only our children) via a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, exited.set_result, None)
    try:
        await asyncio.wait_for(exited, within_s)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.fixture(autouse=True)
def no_leaked_processes():
    before = child_pids()
    yield
    leaked = child_pids() - before
    assert not leaked, f"child processes left running: {sorted(leaked)}"


def echo_spec(name: str = "echo", **kw) -> common_pb2.FunctionSpec:
    kw.setdefault("readiness_path", "/healthz")
    kw.setdefault("resources", common_pb2.Resources(cpu_millis=250, memory_mib=64))
    kw.setdefault("concurrency", 4)
    return common_pb2.FunctionSpec(name=name, command=ECHO, **kw)


def py_spec(code: str, name: str = "py", **kw) -> common_pb2.FunctionSpec:
    """A function whose instance runs `python -c code`."""
    return common_pb2.FunctionSpec(name=name, command=[sys.executable, "-c", code], **kw)


@contextlib.asynccontextmanager
async def stand_in(on_request: Callable[[], None] = lambda: None) -> AsyncIterator[int]:
    """An aiohttp server on 127.0.0.1 that stands for an instance behind a
    door (``POST /echo`` answers the body; on_request is called for each);
    yields its port."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        on_request()
        return web.Response(text=await request.text())

    app = web.Application()
    app.router.add_post("/echo", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def host_dial() -> socket.socket:
    """A door's dial for an instance that stands in the host's namespace (a
    test server): a non-blocking TCP socket of this namespace."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    return s


async def http(address: str, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.0 request over asyncio streams; returns (status, body)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        data = await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()
        await writer.wait_closed()
    header, _, payload = data.partition(b"\r\n\r\n")
    return int(header.split()[1]), payload


def cgroups_or_skip() -> Cgroups:
    """This host's instance cgroups; the test is skipped where they cannot
    be made (in CI: failed, so that it never silently stops running)."""
    try:
        return Cgroups()
    except CgroupError as e:
        if os.environ.get("CI"):
            pytest.fail(f"cgroups unavailable in CI: {e}")
        pytest.skip(str(e))


def no_groups_left(groups: Cgroups) -> None:
    """Asserts the agent's cgroups were all removed."""
    assert not any(p.exists() for p in groups.parents), "agent cgroups left behind"


@pytest.fixture
async def process_backend(tmp_path) -> AsyncIterator[ProcessBackend]:
    backend = ProcessBackend(log_dir=tmp_path / "logs", stop_grace_s=2.0)
    yield backend
    await backend.close()


@dataclass
class Agent:
    servicer: NodeAgentServicer
    server: grpc.aio.Server
    address: str
    stub: nodeagent_pb2_grpc.NodeAgentStub
    channel: grpc.aio.Channel


MakeAgent = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def pool() -> AsyncIterator[rpc.ChannelPool]:
    p = rpc.ChannelPool(RpcConfig(deadline_s=5.0))
    yield p
    await p.close()


@pytest.fixture
async def make_agent(pool) -> AsyncIterator[MakeAgent]:
    """Starts a NodeAgentServicer on a loopback gRPC server; tears it all down."""
    agents: list[Agent] = []

    async def make(nodes: Iterable[tuple[str, Res]], backend: SandboxBackend, **kw: int) -> Agent:
        servicer = NodeAgentServicer(nodes, backend, pool, **kw)  # type: ignore[arg-type]
        add = nodeagent_pb2_grpc.add_NodeAgentServicer_to_server
        server, port, _ = rpc.create_server("127.0.0.1:0", [(add, servicer, SERVICE_NAME)])
        await server.start()
        address = f"127.0.0.1:{port}"
        servicer.attach(address)
        channel = rpc.insecure_channel(address)
        agent = Agent(servicer, server, address, nodeagent_pb2_grpc.NodeAgentStub(channel), channel)
        agents.append(agent)
        return agent

    yield make
    for a in agents:
        await a.channel.close()
        await a.server.stop(None)
        await a.servicer.close()


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    """Real control components, started by the test; all stopped after it."""
    # Imported here: test_sandbox runs this module as a plain script.
    from .peers import Peers

    p = Peers()
    yield p
    await p.close()


StartRegistrar = Callable[..., Awaitable[tuple[Registrar, Agent]]]


@pytest.fixture
async def start_registrar(peers, make_agent, pool) -> AsyncIterator[StartRegistrar]:
    """Serves an agent with n emulated nodes (node-0 ..) and starts a
    Registrar for them; the controller is the peers' unless given."""
    registrars: list[Registrar] = []

    async def start(n: int, controller: str | None = None, **kw) -> tuple[Registrar, Agent]:
        nodes = [(f"node-{i}", Res(1000, 1000, 0)) for i in range(n)]
        agent = await make_agent(nodes, EmulatedBackend())
        kw.setdefault("membership_refresh_s", 0.05)
        reg = Registrar(
            list(agent.servicer.nodes),
            agent.servicer.heartbeat_status,
            controller or peers.controller,
            pool,
            **kw,
        )
        registrars.append(reg)
        await reg.start()
        return reg, agent

    yield start
    for r in registrars:
        await r.stop()
