"""ClusterMgr over real gRPC on loopback, with real Schedule servicers as the
receivers of ModNode: repartitioning, liveness, restarts, bad input."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from controlplane.runtime import rendezvous
from controlplane.runtime.clock import Clock, ManualClock, MonotonicClock
from controlplane.runtime.rpc import ChannelPool, create_server, insecure_channel
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME as CM_SERVICE
from functions.clustermgr.service import ClusterMgrServicer
from functions.schedule.policy import PlacementPolicy
from functions.schedule.service import SERVICE_NAME as SF_SERVICE
from functions.schedule.service import ScheduleServicer
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    dispatch_pb2_grpc,
    schedule_pb2_grpc,
)

SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR
NODE_IDS = [f"node-{i}" for i in range(30)]


def status(nid: str, seq: int) -> common_pb2.NodeStatus:
    # The agents are not called in these tests; the address only has to be set.
    return common_pb2.NodeStatus(
        node_id=nid,
        address="127.0.0.1:1",
        capacity=common_pb2.Resources(cpu_millis=1000, memory_mib=1024),
        seq=seq,
    )


class Env:
    def __init__(self) -> None:
        self.pool = ChannelPool()
        self.cleanups: list[Callable[[], Awaitable[Any]]] = [self.pool.close]
        self.scheds: dict[str, ScheduleServicer] = {}
        self.addrs: dict[str, str] = {}
        self.records: dict[str, bytes | None] = {}
        self.deleted = asyncio.Event()

    async def serve(self, add: Callable[[Any, Any], None], servicer: Any, name: str) -> str:
        server, port, _ = create_server("127.0.0.1:0", [(add, servicer, name)])
        await server.start()
        self.cleanups.append(lambda: server.stop(None))
        return f"127.0.0.1:{port}"

    def record(self, key: str, value: bytes | None) -> None:
        self.records[key] = value
        if value is None:
            self.deleted.set()

    async def start(
        self, clock: Clock, n_sched: int, linger_s: float | None = None, **cm_kw: Any
    ) -> None:
        for i in range(1, n_sched + 1):
            sid = f"s-{i}"
            self.scheds[sid] = s = ScheduleServicer(
                PlacementPolicy(), schedule_id=sid, pool=self.pool
            )
            self.addrs[sid] = await self.serve(
                schedule_pb2_grpc.add_ScheduleServicer_to_server, s, SF_SERVICE
            )
        self.cm = ClusterMgrServicer(
            NodeRegistry(clock=clock, **cm_kw), clustermgr_id="c-1", pool=self.pool,
            record=self.record, refresh_linger_s=linger_s,
        )  # fmt: skip
        self.cleanups.append(self.cm.stop)
        self.addrs["c-1"] = await self.serve(
            clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, self.cm, CM_SERVICE
        )
        ch = insecure_channel(self.addrs["c-1"])
        self.cleanups.append(ch.close)
        self.cmf = clustermgr_pb2_grpc.ClusterMgrStub(ch)

    async def coordinate(self, epoch: int, members: list[str]) -> None:
        m = common_pb2.Membership(epoch=epoch)
        for mid in members:
            kind = SCHEDULE if mid.startswith("s-") else CLUSTERMGR
            m.instances.add(id=mid, kind=kind, address=self.addrs[mid])
        req = common_pb2.CoordinateRequest(membership=m)
        # As the controller does: every member hears of the change; order is
        # not guaranteed, so ClusterMgr goes first here (the harder order).
        assert (await self.cmf.Coordinate(req, timeout=5)).epoch == epoch
        for sid, s in self.scheds.items():
            if sid in members:
                await s.Coordinate(req, None)  # type: ignore[arg-type]
        await self.cm.outbox.flush()

    def partition(self, sid: str) -> set[str]:
        return {n.node_id for n in self.scheds[sid].policy.nodes()}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    yield e
    for c in reversed(e.cleanups):
        await c()


async def test_new_schedule_instance_gets_exactly_its_nodes(env: Env) -> None:
    clock = ManualClock()
    await env.start(clock, n_sched=2, linger_s=0.0)  # refreshes go at once
    await env.coordinate(1, ["s-1", "c-1"])
    for nid in NODE_IDS:
        await env.cmf.RegisterNode(status(nid, 1), timeout=5)
    await env.cm.outbox.flush()
    assert env.partition("s-1") == set(NODE_IDS) and env.partition("s-2") == set()

    await env.coordinate(2, ["s-1", "s-2", "c-1"])
    await heartbeat_all(env, clock, 2)
    want_s2 = {n for n in NODE_IDS if rendezvous.owner(n, ["s-1", "s-2"]) == "s-2"}
    assert 0 < len(want_s2) < len(NODE_IDS)
    assert env.partition("s-2") == want_s2
    assert env.partition("s-1") == set(NODE_IDS) - want_s2
    listed = await env.cmf.ListNodes(clustermgr_pb2.ListClusterNodesRequest(), timeout=5)
    assert listed.clustermgr_id == "c-1"
    assert {c.status.node_id: c.schedule_id for c in listed.nodes} == {
        n: ("s-2" if n in want_s2 else "s-1") for n in NODE_IDS
    }
    # s-1 leaves: its nodes go to s-2.
    await env.coordinate(3, ["s-2", "c-1"])
    await heartbeat_all(env, clock, 3)
    assert env.partition("s-2") == set(NODE_IDS)


async def heartbeat_all(env: Env, clock: ManualClock, seq: int) -> None:
    """One refresh period later, one heartbeat from every node, then the
    outbox drained. A membership change's re-sends go out at once, but one
    can reach a Schedule instance before that instance has heard of the
    change (it then refuses a node it does not own yet: here ClusterMgr
    hears first) or be given up on a loaded machine; the node's next
    refresh, due a refresh period after its last forward, sends it again.
    An unchanged heartbeat before that is not forwarded, so the clock moves
    by the period: the bound the partition is held to is one refresh."""
    clock.advance(env.cm.forwarding.refresh_s)
    for nid in NODE_IDS:
        await env.cmf.Update(status(nid, seq), timeout=5)
    await env.cm.outbox.flush()


async def test_heartbeats_liveness_and_revival(env: Env) -> None:
    clock = ManualClock()
    await env.start(clock, n_sched=1, dead_after_s=3.0)
    await env.coordinate(1, ["s-1", "c-1"])
    reply = await env.cmf.Update(status("stranger", 1), timeout=5)
    assert reply.reregister  # unknown: register first
    for nid in NODE_IDS[:4]:
        await env.cmf.RegisterNode(status(nid, 1), timeout=5)
    clock.advance(2.0)
    for nid in NODE_IDS[:2]:
        assert not (await env.cmf.Update(status(nid, 2), timeout=5)).reregister
    clock.advance(1.5)
    assert sorted(env.cm.check_liveness()) == NODE_IDS[2:4]
    assert env.cm.check_liveness() == []  # declared once
    await env.cm.outbox.flush()
    assert env.partition("s-1") == set(NODE_IDS[:2])
    assert env.records[f"/galaxy/nodes/{NODE_IDS[2]}"] is None
    listed = await env.cmf.ListNodes(clustermgr_pb2.ListClusterNodesRequest(), timeout=5)
    by_id = {c.status.node_id: c for c in listed.nodes}
    assert not by_id[NODE_IDS[2]].alive and by_id[NODE_IDS[0]].alive
    assert by_id[NODE_IDS[2]].last_seen_ms == pytest.approx(3500.0)
    assert by_id[NODE_IDS[0]].last_seen_ms == pytest.approx(1500.0)
    # A dead node that heartbeats again is back, at its owner too.
    await env.cmf.Update(status(NODE_IDS[2], 2), timeout=5)
    await env.cm.outbox.flush()
    assert NODE_IDS[2] in env.partition("s-1")
    assert env.records[f"/galaxy/nodes/{NODE_IDS[2]}"] is not None


async def test_liveness_loop_runs_by_itself(env: Env) -> None:
    await env.start(MonotonicClock(), n_sched=1, dead_after_s=0.15)
    env.cm.heartbeat_s = 0.05
    await env.coordinate(1, ["s-1", "c-1"])
    await env.cmf.RegisterNode(status("quiet", 1), timeout=5)
    await env.cm.outbox.flush()
    assert env.partition("s-1") == {"quiet"}
    await env.cm.start()
    await asyncio.wait_for(env.deleted.wait(), 5.0)
    await env.cm.outbox.flush()
    assert env.partition("s-1") == set()


@pytest.mark.slow
async def test_a_silent_node_is_declared_dead_at_its_deadline(env: Env) -> None:
    # Nodes fall silent at phases spread over a whole round of what a
    # periodic sweep would be (heartbeat / 2 = 1 s): a sweep would find one
    # of them late by most of a round (>= 0.8 s); a timer on each deadline
    # finds every one on time, late only by the event loop's latency (the
    # bound leaves half a second for a loaded machine).
    dead_after, heartbeat, spacing = 0.4, 2.0, 0.2
    declared: dict[str, float] = {}
    all_dead = asyncio.Event()
    names = [f"quiet-{i}" for i in range(6)]

    def record(key: str, value: bytes | None) -> None:
        if value is None:
            declared[key.rsplit("/", 1)[1]] = time.monotonic()
            if len(declared) == len(names):
                all_dead.set()

    env.record = record  # type: ignore[method-assign]
    await env.start(MonotonicClock(), n_sched=1, dead_after_s=dead_after)
    env.cm.heartbeat_s = heartbeat
    await env.coordinate(1, ["s-1", "c-1"])
    await env.cm.start()
    for i, nid in enumerate(names):
        await env.cmf.RegisterNode(status(nid, 1), timeout=5)  # its last beat
        if i < len(names) - 1:
            await asyncio.sleep(spacing)  # spreads the stimuli, not a sync
    await asyncio.wait_for(all_dead.wait(), 5.0)
    for nid in names:
        rec = env.cm.registry.get(nid)
        assert rec is not None and not rec.alive
        late = declared[nid] - (rec.last_seen + dead_after)
        # Never early; late only by the event loop's own latency.
        assert 0.0 <= late < 0.5, (nid, late)


async def test_restarted_agent_with_lower_seq_replaces_the_old_one(env: Env) -> None:
    await env.start(ManualClock(), n_sched=1)
    await env.coordinate(1, ["s-1", "c-1"])
    await env.cmf.RegisterNode(status("n", 100), timeout=5)
    await env.cmf.Update(status("n", 50), timeout=5)  # reordered: ignored
    await env.cm.outbox.flush()
    assert env.scheds["s-1"].policy.nodes()[0].seq == 100
    await env.cmf.RegisterNode(status("n", 1), timeout=5)  # a new incarnation
    await env.cm.outbox.flush()
    assert env.scheds["s-1"].policy.nodes()[0].seq == 1


class CoordinateRecorder(dispatch_pb2_grpc.DispatchServicer):
    """Records the Coordinate calls a Dispatch instance receives (only what
    ClusterMgr sends is under test here; Dispatch's handling of a dead node
    is tested in tests/dispatch)."""

    def __init__(self) -> None:
        self.dead: asyncio.Queue[str] = asyncio.Queue(maxsize=100)

    async def Coordinate(
        self, request: common_pb2.CoordinateRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CoordinateReply:
        for a in request.actions:
            if a.kind == common_pb2.CoordinateAction.KIND_NODE_DEAD:
                self.dead.put_nowait(a.node_id)
        return common_pb2.CoordinateReply()


async def test_quick_agent_restart_ends_its_instances_in_dispatch(env: Env) -> None:
    """An agent killed and restarted before it could be declared dead
    registers with a new incarnation (and a higher seq): Dispatch hears at
    once that the node's old instances are gone."""
    await env.start(ManualClock(), n_sched=1)
    recorder = CoordinateRecorder()
    addr = await env.serve(dispatch_pb2_grpc.add_DispatchServicer_to_server, recorder, "d")
    m = common_pb2.Membership(epoch=1)
    m.instances.add(id="s-1", kind=SCHEDULE, address=env.addrs["s-1"])
    m.instances.add(id="c-1", kind=CLUSTERMGR, address=env.addrs["c-1"])
    m.instances.add(id="d-1", kind=common_pb2.CONTROL_KIND_DISPATCH, address=addr)
    await env.cmf.Coordinate(common_pb2.CoordinateRequest(membership=m), timeout=5)
    first = status("n", 100)
    first.incarnation = 100
    await env.cmf.RegisterNode(first, timeout=5)
    again = status("n", 120)
    again.incarnation = 100  # the same life registering again: nothing ended
    await env.cmf.RegisterNode(again, timeout=5)
    restarted = status("n", 130)
    restarted.incarnation = 130
    await env.cmf.RegisterNode(restarted, timeout=5)
    assert await asyncio.wait_for(recorder.dead.get(), 5) == "n"
    assert recorder.dead.empty()  # the refresh of the same life told nothing
    await env.cm.outbox.flush()
    assert env.scheds["s-1"].policy.nodes()[0].seq == 130


async def test_bad_registration_is_invalid_argument(env: Env) -> None:
    await env.start(ManualClock(), n_sched=1)
    good = status("n", 1)
    for field_ in ("node_id", "address", "capacity"):
        bad = common_pb2.NodeStatus()
        bad.CopyFrom(good)
        bad.ClearField(field_)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await env.cmf.RegisterNode(bad, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(field_)
    assert len(env.cm.registry) == 0
