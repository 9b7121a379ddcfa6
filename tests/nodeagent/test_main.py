"""The node agent component: flags, build(), start/stop in-process, and a
real agent process run by controlplane.runtime.host.serve."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

import pytest

from controlplane.nodeagent.main import NodeAgentComponent, add_arguments, build
from controlplane.nodeagent.sandbox import EmulatedBackend, ProcessBackend
from controlplane.nodeagent.sandbox.cgroups import DEFAULT_MAX_PIDS
from controlplane.nodeagent.sandbox.workdirs import InstanceDirs
from controlplane.runtime import rpc
from controlplane.runtime.host import READY_PREFIX, HostContext
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc

from .conftest import REPO, echo_spec, wait_pid_exit
from .peers import list_nodes


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_flag_defaults():
    a = parse()
    assert (a.nodes, a.node_prefix, a.node_index_start, a.sandbox) == (1, "node", 0, "bwrap")
    assert (a.cpu_millis, a.memory_mib, a.gpus) == (4000, 8192, 0)
    assert (a.start_delay_ms, a.heartbeat_ms, a.log_dir) == (0.0, 1000, None)
    with pytest.raises(SystemExit):
        parse("--sandbox", "docker")


async def test_build_emulated_pool_ids_and_capacity():
    comp = build(
        parse(
            "--nodes",
            "3",
            "--node-prefix",
            "emu",
            "--node-index-start",
            "105",
            "--sandbox",
            "emulated",
            "--cpu-millis",
            "2000",
            "--gpus",
            "1",
        )
    )
    assert isinstance(comp, NodeAgentComponent) and comp.kind == 0
    assert list(comp.servicer.nodes) == ["emu-105", "emu-106", "emu-107"]
    assert isinstance(comp.servicer.backend, EmulatedBackend)
    st = comp.servicer.nodes["emu-106"].status()
    assert st.capacity == common_pb2.Resources(cpu_millis=2000, memory_mib=8192, gpus=1)
    await comp.stop()


async def test_build_process_backend_uses_log_dir(tmp_path):
    comp = build(parse("--log-dir", str(tmp_path)))
    assert isinstance(comp.servicer.backend, ProcessBackend)
    assert comp.servicer.backend.log_dir == tmp_path
    await comp.stop()


async def test_isolation_flags(tmp_path):
    a = parse()
    assert (a.instance_max_pids, a.instance_dir) == (DEFAULT_MAX_PIDS, None)
    with pytest.raises(ValueError, match="--instance-max-pids"):
        build(parse("--instance-max-pids", "-1"))
    comp = build(
        parse("--cgroups", "off", "--instance-max-pids", "0", "--instance-dir", str(tmp_path))
    )
    backend = comp.servicer.backend
    assert isinstance(backend, ProcessBackend)
    assert backend.dirs.root == tmp_path and backend.max_pids == 0
    await comp.stop()
    # A planted symlink (say in a shared /tmp) is not taken as the directory.
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="--instance-dir"):
        build(parse("--cgroups", "off", "--instance-dir", str(tmp_path / "link")))


async def serve_component(comp: NodeAgentComponent, controller: str, pool: rpc.ChannelPool):
    server, port, _ = rpc.create_server("127.0.0.1:0", comp.services())
    await server.start()
    ctx = HostContext("agent-0", f"127.0.0.1:{port}", "", controller, pool)
    await comp.start(ctx)
    return server, ctx


async def test_start_without_controller_serves_and_stops(pool, tmp_path):
    comp = build(parse("--nodes", "2", "--log-dir", str(tmp_path)))
    server, ctx = await serve_component(comp, "", pool)
    try:
        assert ctx.extra["nodes"] == ["node-0", "node-1"]
        assert comp.registrar is None
        async with pool.stub(ctx.address, nodeagent_pb2_grpc.NodeAgentStub) as stub:
            reply = await stub.CreateInstance(
                nodeagent_pb2.CreateInstanceRequest(
                    node_id="node-1", instance_id="i", function=echo_spec()
                )
            )
            probe = await stub.Probe(nodeagent_pb2.ProbeRequest(node_id="node-1"))
        assert reply.instance.node_id == "node-1"
        assert probe.status.address == ctx.address and probe.status.instances == 1
    finally:
        await server.stop(None)
        await comp.stop()  # kills the instance (checked by no_leaked_processes)


async def test_start_with_controller_registers(pool, peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    comp = build(parse("--nodes", "4", "--sandbox", "emulated"))
    server, ctx = await serve_component(comp, peers.controller, pool)
    try:
        assert comp.registrar is not None
        await asyncio.wait_for(comp.registrar.registered.wait(), 10)
        listed = await list_nodes(pool, cm)
        assert sorted(listed) == ["node-0", "node-1", "node-2", "node-3"]
        assert all(n.status.address == ctx.address for n in listed.values())
    finally:
        await comp.stop()
        await server.stop(None)


AGENT = """
import argparse, asyncio, sys
from controlplane.runtime import host
from controlplane.nodeagent.main import add_arguments, build
p = argparse.ArgumentParser()
add_arguments(p)
args = p.parse_args(sys.argv[1:])
asyncio.run(host.serve(build(args), instance_id="agent-t", listen="127.0.0.1:0",
                       metrics_listen=None, controller=""))
"""


@pytest.mark.slow  # starts a node agent process, then its instances
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_agent_process_leaves_no_instances(tmp_path, how):
    """A real agent process: ready line, create an instance, then stop the
    agent; its instance must go too, whether the agent stops cleanly
    (SIGTERM) or is killed (SIGKILL: PR_SET_PDEATHSIG)."""
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT,
        "--nodes",
        "2",
        "--log-dir",
        str(tmp_path),
        "--instance-dir",
        str(tmp_path / "inst"),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(agent.stdout.readline(), 15)).decode()
        assert line.startswith(READY_PREFIX), line
        ready = json.loads(line[len(READY_PREFIX) :])
        assert ready["nodes"] == ["node-0", "node-1"] and ready["kind"] == "nodeagent"
        ch = rpc.insecure_channel(ready["address"])
        try:
            stub = nodeagent_pb2_grpc.NodeAgentStub(ch)
            req = nodeagent_pb2.CreateInstanceRequest(
                node_id="node-0", instance_id="e", function=echo_spec()
            )
            reply = await stub.CreateInstance(req, timeout=10)
        finally:
            await ch.close()
        pid = _pid_listening(int(reply.instance.address.rsplit(":", 1)[1]))
        agent.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        rc = await asyncio.wait_for(agent.wait(), 10)
        assert rc == (0 if how == "sigterm" else -signal.SIGKILL)
        await wait_pid_exit(pid)
        # Its private directories go with a clean stop; a killed agent's are
        # swept by the next agent to use the same --instance-dir.
        left = list((tmp_path / "inst").iterdir())
        assert [d.name.split(".")[0] for d in left] == (
            [] if how == "sigterm" else [str(agent.pid)]
        )
        InstanceDirs(tmp_path / "inst")
        assert not any((tmp_path / "inst").iterdir())
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


def _pid_listening(port: int) -> int:
    """The pid of the process whose listening socket is on port (via /proc)."""
    hexport = f":{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as f:
        for row in f.readlines()[1:]:
            cols = row.split()
            if cols[1].endswith(hexport) and cols[3] == "0A":  # LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"nobody listens on port {port}")
