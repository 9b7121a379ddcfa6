"""NodeAgent gRPC service over real loopback gRPC, with real subprocesses
(process sandbox), a 50-node emulated pool, and the real Dispatch told of an
instance's exit."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

import grpc
import pytest

from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.runtime.resources import Res
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import (
    common_pb2,
    dispatch_pb2,
    dispatch_pb2_grpc,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
)
from tests.cluster import eventually
from tests.runtimes import deploy

from .conftest import child_pids, echo_spec, http, py_spec

CAP = Res(1000, 1024, 0)
SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE


def create(node: str, iid: str, spec: common_pb2.FunctionSpec, notify: str = ""):
    return nodeagent_pb2.CreateInstanceRequest(
        node_id=node, instance_id=iid, function=spec, notify_address=notify
    )


async def probe(agent, node: str) -> common_pb2.NodeStatus:
    return (await agent.stub.Probe(nodeagent_pb2.ProbeRequest(node_id=node), timeout=5)).status


async def expect_code(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value.details()
    return e.value.details()


async def test_create_is_idempotent_one_process(make_agent, process_backend):
    agent = await make_agent([("n-0", CAP)], process_backend)
    before = child_pids()
    spec = echo_spec(version=7)
    req = create("n-0", "inst-1", spec)
    a, b = await asyncio.gather(
        agent.stub.CreateInstance(req, timeout=10), agent.stub.CreateInstance(req, timeout=10)
    )
    c = await agent.stub.CreateInstance(req, timeout=10)  # after ready
    assert a.instance == b.instance == c.instance
    assert len(child_pids() - before) == 1
    info = a.instance
    assert (info.instance_id, info.function, info.node_id) == ("inst-1", "echo", "n-0")
    assert info.spec_version == 7 and info.concurrency == 4
    assert a.startup_ms > 0
    status, body = await http(info.address, "POST", "/", b"x")
    assert status == 200 and json.loads(body)["instance"] == "inst-1"
    st = await probe(agent, "n-0")
    assert st.instances == 1 and st.allocated == common_pb2.Resources(cpu_millis=250, memory_mib=64)
    listed = await agent.stub.ListNodeInstances(
        nodeagent_pb2.ListNodeInstancesRequest(node_id="n-0")
    )
    assert list(listed.instances) == [info]


async def test_starts_beyond_max_launching_wait_their_turn(make_agent, process_backend):
    from controlplane.runtime.metrics import NODEAGENT_LAUNCH_WAITING as WAITING

    agent = await make_agent([("n-0", CAP)], process_backend, max_launching=1)
    before = child_pids()
    calls = [
        agent.stub.CreateInstance(create("n-0", f"i{k}", echo_spec()), timeout=30) for k in range(3)
    ]
    done = asyncio.gather(*calls)
    # One sandbox launched, two starts waiting for it to be ready.
    await eventually(
        lambda: WAITING._value.get() == 2 and len(child_pids() - before) == 1,
        within_s=10,
        what="one launch at a time",
    )
    replies = await done
    assert sorted(r.instance.instance_id for r in replies) == ["i0", "i1", "i2"]
    assert WAITING._value.get() == 0 and len(child_pids() - before) == 3


async def test_same_instance_id_for_another_function_is_rejected(make_agent):
    agent = await make_agent([("n-0", CAP)], EmulatedBackend())
    await agent.stub.CreateInstance(create("n-0", "i", common_pb2.FunctionSpec(name="a")))
    details = await expect_code(
        agent.stub.CreateInstance(create("n-0", "i", common_pb2.FunctionSpec(name="b"))),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "instance_id i is already used" in details


async def test_resource_exhausted_with_message(make_agent):
    agent = await make_agent([("n-3", CAP)], EmulatedBackend())
    big = common_pb2.FunctionSpec(name="big", resources=common_pb2.Resources(cpu_millis=600))
    await agent.stub.CreateInstance(create("n-3", "a", big))
    details = await expect_code(
        agent.stub.CreateInstance(create("n-3", "b", big)), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert details == "node n-3 has 400m cpu free, instance needs 600m"
    st = await probe(agent, "n-3")
    assert st.instances == 1 and st.allocated.cpu_millis == 600


async def test_unknown_node_is_not_found(make_agent):
    agent = await make_agent([("n-0", CAP)], EmulatedBackend())
    spec = common_pb2.FunctionSpec(name="f")
    details = await expect_code(
        agent.stub.CreateInstance(create("nope", "i", spec)), grpc.StatusCode.NOT_FOUND
    )
    assert "nope" in details
    for call in (
        agent.stub.Probe(nodeagent_pb2.ProbeRequest(node_id="nope")),
        agent.stub.DeleteInstance(
            nodeagent_pb2.DeleteInstanceRequest(node_id="nope", instance_id="i")
        ),
        agent.stub.ListNodeInstances(nodeagent_pb2.ListNodeInstancesRequest(node_id="nope")),
    ):
        await expect_code(call, grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (create("n-0", "i", common_pb2.FunctionSpec(name="f")), "function.command"),
        (create("n-0", "", echo_spec()), "instance_id"),
        (create("n-0", "i", echo_spec(name="")), "function.name"),
        (create("n-0", "i", echo_spec(workdir="relative/dir")), "function.workdir"),
        (create("", "i", echo_spec()), "node_id"),
    ],
)
async def test_invalid_argument_names_the_field(make_agent, process_backend, req, field):
    agent = await make_agent([("n-0", CAP)], process_backend)
    details = await expect_code(agent.stub.CreateInstance(req), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in details
    assert (await probe(agent, "n-0")).instances == 0


async def test_probe_and_delete_free_capacity(make_agent):
    agent = await make_agent([("n-0", CAP)], EmulatedBackend())
    spec = common_pb2.FunctionSpec(
        name="f", resources=common_pb2.Resources(cpu_millis=300, memory_mib=100)
    )
    s0 = await probe(agent, "n-0")
    assert s0.capacity == CAP.to_proto() and s0.address == agent.address
    await agent.stub.CreateInstance(create("n-0", "a", spec))
    await agent.stub.CreateInstance(create("n-0", "b", spec))
    s1 = await probe(agent, "n-0")
    assert s1.allocated == common_pb2.Resources(cpu_millis=600, memory_mib=200)
    assert s1.instances == 2 and s1.seq > s0.seq
    d = await agent.stub.DeleteInstance(
        nodeagent_pb2.DeleteInstanceRequest(node_id="n-0", instance_id="a")
    )
    assert d.deleted
    again = await agent.stub.DeleteInstance(
        nodeagent_pb2.DeleteInstanceRequest(node_id="n-0", instance_id="a")
    )
    assert not again.deleted
    s2 = await probe(agent, "n-0")
    assert s2.allocated == common_pb2.Resources(cpu_millis=300, memory_mib=100)
    assert s2.instances == 1 and s2.seq > s1.seq
    # One life of the agent reports one incarnation while its seq advances.
    assert s0.incarnation != 0 and s0.incarnation == s1.incarnation == s2.incarnation


async def test_a_restarted_agent_reports_a_new_incarnation(make_agent):
    first = await make_agent([("n-0", CAP)], EmulatedBackend())
    before = await probe(first, "n-0")
    second = await make_agent([("n-0", CAP)], EmulatedBackend())
    after = await probe(second, "n-0")
    assert after.incarnation != before.incarnation


async def test_failed_start_is_unavailable_and_frees(make_agent, process_backend):
    agent = await make_agent([("n-0", CAP)], process_backend)
    spec = py_spec("import sys; sys.exit(4)", resources=common_pb2.Resources(cpu_millis=900))
    details = await expect_code(
        agent.stub.CreateInstance(create("n-0", "bad", spec)), grpc.StatusCode.UNAVAILABLE
    )
    assert "process exited with code 4" in details
    st = await probe(agent, "n-0")
    assert st.instances == 0 and st.allocated.cpu_millis == 0


# A real process sandbox's start and exit: 1-2 s on a quiet machine, past the
# fast tier's bound under load.
@pytest.mark.slow
async def test_delete_process_instance_kills_it(make_agent, process_backend):
    agent = await make_agent([("n-0", CAP)], process_backend)
    before = child_pids()
    await agent.stub.CreateInstance(create("n-0", "k", echo_spec()), timeout=10)
    (pid,) = child_pids() - before
    d = await agent.stub.DeleteInstance(
        nodeagent_pb2.DeleteInstanceRequest(node_id="n-0", instance_id="k")
    )
    assert d.deleted
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_delete_while_starting(make_agent, process_backend):
    agent = await make_agent([("n-0", CAP)], process_backend)
    # The instance calls back once it runs (so the test knows the start is
    # under way) and then never becomes ready.
    spawned = asyncio.Event()

    async def on_call(reader, writer):
        spawned.set()
        writer.close()

    beacon = await asyncio.start_server(on_call, "127.0.0.1", 0)
    port = beacon.sockets[0].getsockname()[1]
    code = f"import socket, time; socket.create_connection(('127.0.0.1', {port})); time.sleep(60)"
    spec = py_spec(code, startup_timeout_ms=30_000, resources=common_pb2.Resources(cpu_millis=100))
    try:
        creating = asyncio.ensure_future(
            agent.stub.CreateInstance(create("n-0", "slow", spec), timeout=30)
        )
        await asyncio.wait_for(spawned.wait(), 10)
        assert (await probe(agent, "n-0")).allocated.cpu_millis == 100
        d = await agent.stub.DeleteInstance(
            nodeagent_pb2.DeleteInstanceRequest(node_id="n-0", instance_id="slow")
        )
        assert d.deleted
        details = await expect_code(creating, grpc.StatusCode.UNAVAILABLE)
        assert "deleted while it was starting" in details
        assert (await probe(agent, "n-0")).allocated.cpu_millis == 0
    finally:
        beacon.close()
        await beacon.wait_closed()


# A real process sandbox's start and exit: 1-2 s on a quiet machine, past the
# fast tier's bound under load.
@pytest.mark.slow
async def test_exit_frees_and_notifies_dispatch(peers, pool, tmp_path, caplog):
    """An instance cold-started through the real Dispatch and Schedule dies:
    the agent frees its node and tells Dispatch (ModInstance OP_REMOVE at the
    notify address Dispatch gave), which stops routing to it."""
    caplog.set_level(logging.INFO, logger="functions.dispatch.coordination")
    await peers.add("controller", "controller")
    await peers.add("clustermgr", "cm")
    schedule = await peers.add("schedule", "schedule-0")
    dispatch = await peers.add("dispatch", "dispatch-0")
    agent = await peers.add("nodeagent", "agent-0", "--log-dir", str(tmp_path))
    routing = dispatch.component.dispatcher
    await eventually(
        lambda: len(schedule.component.policy) == 1 and routing.membership.ids(SCHEDULE),
        what="the node reaching Schedule and Schedule reaching Dispatch",
    )
    before = child_pids()
    async with GalaxyClient(peers.controller) as client:
        await deploy(client, echo_spec())
        addr = await client.dispatch("echo")
        assert addr.cold_start and addr.node_id == "node-0"
        assert await client.release(addr)
    (pid,) = child_pids() - before
    assert await dispatched(pool, dispatch) == [addr.instance_id]
    st = await probe_at(pool, agent.address, "node-0")
    assert st.instances == 1 and st.allocated.cpu_millis == 250
    os.kill(pid, signal.SIGKILL)
    await eventually(lambda: not routing.router_of("echo").instances, what="Dispatch drops it")
    assert await dispatched(pool, dispatch) == []
    assert any(
        m.startswith(f"instance {addr.instance_id} removed: process exited with code -9")
        for m in caplog.messages
    ), caplog.messages
    st = await probe_at(pool, agent.address, "node-0")
    assert st.instances == 0 and st.allocated.cpu_millis == 0


async def dispatched(pool, dispatch) -> list[str]:
    """Ids of the instances Dispatch routes to, from its ListInstances RPC."""
    async with pool.stub(dispatch.address, dispatch_pb2_grpc.DispatchStub) as stub:
        reply = await stub.ListInstances(dispatch_pb2.ListInstancesRequest(), timeout=5)
    return [i.instance.instance_id for i in reply.instances]


async def probe_at(pool, address: str, node: str) -> common_pb2.NodeStatus:
    async with pool.stub(address, nodeagent_pb2_grpc.NodeAgentStub) as stub:
        reply = await stub.Probe(nodeagent_pb2.ProbeRequest(node_id=node), timeout=5)
    return reply.status


async def test_emulated_pool_of_50_nodes(make_agent):
    nodes = [(f"pool-{i}", Res(1500, 4096, 0)) for i in range(50)]
    agent = await make_agent(nodes, EmulatedBackend(start_delay_ms=5))
    spec = common_pb2.FunctionSpec(
        name="llm", resources=common_pb2.Resources(cpu_millis=500, memory_mib=1024), concurrency=2
    )
    replies = await asyncio.gather(
        *(
            agent.stub.CreateInstance(create(nid, f"{nid}-i{k}", spec), timeout=10)
            for nid, _ in nodes
            for k in range(3)
        )
    )
    assert len({r.instance.address for r in replies}) == 150
    assert all(r.instance.address.startswith("emulated://pool-") for r in replies)
    for nid, _ in nodes:
        st = await probe(agent, nid)
        assert st.instances == 3 and st.allocated.cpu_millis == 1500, nid
    await expect_code(
        agent.stub.CreateInstance(create("pool-7", "one-too-many", spec)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    listed = await agent.stub.ListNodeInstances(
        nodeagent_pb2.ListNodeInstancesRequest(node_id="pool-9")
    )
    assert sorted(i.instance_id for i in listed.instances) == [f"pool-9-i{k}" for k in range(3)]
    await asyncio.gather(
        *(
            agent.stub.DeleteInstance(
                nodeagent_pb2.DeleteInstanceRequest(node_id=nid, instance_id=f"{nid}-i0")
            )
            for nid, _ in nodes
        )
    )
    assert (await probe(agent, "pool-49")).allocated.cpu_millis == 1000


async def test_a_full_start_queue_sheds_with_resource_exhausted(make_agent):
    from prometheus_client import REGISTRY

    def shed() -> float:
        labels = {"reason": "queue_full"}
        return REGISTRY.get_sample_value("galaxy_nodeagent_rejected_total", labels) or 0.0

    # Starts that take long: they stay in the queue for the whole test.
    agent = await make_agent([("n-0", CAP), ("n-1", CAP)], EmulatedBackend(start_delay_ms=60_000))
    agent.servicer.max_starting = 2
    small = common_pb2.FunctionSpec(name="f", resources=common_pb2.Resources(cpu_millis=10))
    calls = [
        asyncio.ensure_future(agent.stub.CreateInstance(create(n, i, small), timeout=30))
        for n, i in (("n-0", "a"), ("n-1", "b"))
    ]
    try:
        await eventually(lambda: agent.servicer.starting == 2, what="two starts queued")
        before = shed()
        details = await expect_code(
            agent.stub.CreateInstance(create("n-0", "c", small), timeout=5),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )
        assert "2 instances starting (max_starting 2)" in details
        assert shed() == before + 1
        assert (await probe(agent, "n-0")).instances == 1  # nothing allocated for c
        # A retry of a queued start joins it: not shed (it just waits).
        await expect_code(
            agent.stub.CreateInstance(create("n-0", "a", small), timeout=0.2),
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        assert shed() == before + 1
        # Room again once a start leaves the queue.
        await agent.stub.DeleteInstance(
            nodeagent_pb2.DeleteInstanceRequest(node_id="n-1", instance_id="b"), timeout=5
        )
        await eventually(lambda: agent.servicer.starting == 1, what="b out of the queue")
        await expect_code(
            agent.stub.CreateInstance(create("n-1", "d", small), timeout=0.2),
            grpc.StatusCode.DEADLINE_EXCEEDED,  # accepted, starting
        )
        assert agent.servicer.starting == 2 and shed() == before + 1
    finally:
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
