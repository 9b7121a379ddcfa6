"""What Schedule pays per node heartbeat: ModNodes calls from a real
ClusterMgr to a real Schedule over loopback gRPC, counted at the receiver.

Unchanged heartbeats are refreshes (every REFRESH_BEATS periods per node);
arriving spread over the period, each used to find the outbox empty and go
in a ModNodes RPC of its own (about one call per two refreshes at 210
nodes), and a call costs Schedule far more in gRPC wake-ups than the
upserts in it. They now wait for company up to the linger, and so do the
statuses of starts the owner placed itself; news (a free) does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.rpc import ChannelPool, create_server, insecure_channel
from functions.clustermgr.forwarding import REFRESH_BEATS
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME as CM_SERVICE
from functions.clustermgr.service import ClusterMgrServicer
from functions.schedule.policy import PlacementPolicy
from functions.schedule.service import SERVICE_NAME as SF_SERVICE
from functions.schedule.service import ScheduleServicer
from galaxy.v1 import clustermgr_pb2_grpc, common_pb2, schedule_pb2, schedule_pb2_grpc

NODES = [f"node-{i}" for i in range(40)]
HEARTBEAT_S = 1.0


class CountingSchedule(ScheduleServicer):
    """A real Schedule servicer that counts the ModNodes calls it serves."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls = 0
        self.messages = 0

    async def ModNodes(
        self, request: schedule_pb2.ModNodesRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ModNodesReply:
        self.calls += 1
        self.messages += len(request.changes)
        return await super().ModNodes(request, context)


def status(nid: str, seq: int, allocated_mib: int = 0) -> common_pb2.NodeStatus:
    return common_pb2.NodeStatus(
        node_id=nid,
        address="127.0.0.1:1",  # never called here
        capacity=common_pb2.Resources(cpu_millis=4000, memory_mib=8192),
        allocated=common_pb2.Resources(memory_mib=allocated_mib),
        seq=seq,
    )


@dataclass
class Pair:
    clock: ManualClock
    sched: CountingSchedule
    cm: ClusterMgrServicer
    stub: clustermgr_pb2_grpc.ClusterMgrStub

    def seqs(self) -> dict[str, int]:
        return {n.node_id: n.seq for n in self.sched.policy.nodes()}


async def _pair(linger_s: float) -> AsyncIterator[Pair]:
    pool = ChannelPool()
    sched = CountingSchedule(PlacementPolicy(), schedule_id="s-1", pool=pool)
    s_server, s_port, _ = create_server(
        "127.0.0.1:0", [(schedule_pb2_grpc.add_ScheduleServicer_to_server, sched, SF_SERVICE)]
    )
    await s_server.start()
    clock = ManualClock()
    cm = ClusterMgrServicer(
        NodeRegistry(clock=clock, dead_after_s=3 * HEARTBEAT_S),
        clustermgr_id="c-1",
        pool=pool,
        heartbeat_s=HEARTBEAT_S,
        refresh_linger_s=linger_s,
        covered_linger_s=linger_s,
    )
    c_server, c_port, _ = create_server(
        "127.0.0.1:0", [(clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, cm, CM_SERVICE)]
    )
    await c_server.start()
    ch = insecure_channel(f"127.0.0.1:{c_port}")
    m = common_pb2.Membership(epoch=1)
    m.instances.add(id="s-1", kind=common_pb2.CONTROL_KIND_SCHEDULE, address=f"127.0.0.1:{s_port}")
    m.instances.add(
        id="c-1", kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=f"127.0.0.1:{c_port}"
    )
    req = common_pb2.CoordinateRequest(membership=m)
    stub = clustermgr_pb2_grpc.ClusterMgrStub(ch)
    await stub.Coordinate(req, timeout=5)
    await sched.Coordinate(req, None)  # type: ignore[arg-type]
    try:
        yield Pair(clock, sched, cm, stub)
    finally:
        await cm.stop()
        await ch.close()
        await c_server.stop(None)
        await s_server.stop(None)
        await pool.close()


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    # The linger is far longer than the test's spread of beats: refreshes
    # of one period go together whatever the machine's speed.
    async for p in _pair(linger_s=30.0):
        yield p


async def _register_all(p: Pair, allocated_mib: int = 0) -> None:
    for nid in NODES:
        await p.stub.RegisterNode(status(nid, 1, allocated_mib), timeout=5)
    # Registrations are news: they go without waiting for the linger.
    await asyncio.wait_for(p.cm.outbox.flush(), 10)
    assert p.seqs() == dict.fromkeys(NODES, 1)


@pytest.mark.slow
async def test_unchanged_heartbeats_cost_schedule_one_call_per_refresh_round(
    pair: Pair,
) -> None:
    p = pair
    await _register_all(p, allocated_mib=256)
    calls = p.sched.calls
    beats = 0
    # REFRESH_BEATS periods of unchanged beats: each node is due for one
    # refresh, in the last period.
    for period in range(1, REFRESH_BEATS + 1):
        p.clock.advance(HEARTBEAT_S)
        for nid in NODES:
            await p.stub.Update(status(nid, 1 + period, 256), timeout=5)
            beats += 1
            # Beats come spread over the period, not in one burst: give the
            # outbox its chance to send each one alone (pacing, not a sync).
            await asyncio.sleep(0.002)
        if period < REFRESH_BEATS:
            assert p.sched.calls == calls  # nothing to tell Schedule yet
    # News (a free) ends the wait and carries the waiting refreshes along.
    p.clock.advance(HEARTBEAT_S)
    await p.stub.Update(status(NODES[0], 100, allocated_mib=0), timeout=5)
    beats += 1
    await asyncio.wait_for(p.cm.outbox.flush(), 10)
    assert p.seqs() == {**dict.fromkeys(NODES, 1 + REFRESH_BEATS), NODES[0]: 100}
    # One call for every refresh of the round and the change: 1/401 per
    # beat. Each refresh alone would be 41 calls (a tenth per beat).
    assert p.sched.calls - calls == 1, (p.sched.calls - calls, beats)
    assert p.cm.outbox.calls == p.sched.calls and p.cm.outbox.failed == 0


async def test_a_free_goes_at_once_despite_the_linger(pair: Pair) -> None:
    p = pair
    await _register_all(p, allocated_mib=256)
    calls = p.sched.calls
    p.clock.advance(HEARTBEAT_S)
    await p.stub.Update(status(NODES[3], 2, allocated_mib=0), timeout=5)
    # Well inside the 30 s lingers: news does not wait for company.
    await asyncio.wait_for(p.cm.outbox.flush(), 5)
    assert p.seqs()[NODES[3]] == 2 and p.sched.calls == calls + 1
    info = next(n for n in p.sched.policy.nodes() if n.node_id == NODES[3])
    assert info.allocated.memory_mib == 0


async def test_a_start_waits_for_company_and_goes_with_the_next_free(pair: Pair) -> None:
    """An allocation that grew is work the owner placed (its view counts it
    already): its status waits for company, and the next news takes it
    along in the same call."""
    p = pair
    await _register_all(p, allocated_mib=256)
    calls = p.sched.calls
    p.clock.advance(HEARTBEAT_S)
    await p.stub.Update(status(NODES[1], 2, allocated_mib=512), timeout=5)  # a start
    await p.stub.Update(status(NODES[2], 2, allocated_mib=0), timeout=5)  # a free
    await asyncio.wait_for(p.cm.outbox.flush(), 5)
    assert p.sched.calls == calls + 1  # one call: the start rode with the free
    assert p.seqs()[NODES[1]] == 2 and p.seqs()[NODES[2]] == 2
    assert p.cm.outbox.sent == p.sched.messages


async def test_refreshes_go_by_themselves_after_the_linger() -> None:
    async for p in _pair(linger_s=0.5):
        await _register_all(p)
        calls = p.sched.calls
        p.clock.advance(REFRESH_BEATS * HEARTBEAT_S)  # all due for a refresh
        for nid in NODES:
            await p.stub.Update(status(nid, 2), timeout=5)
        # No change comes: the refreshes still go, once the linger is over.
        await asyncio.wait_for(p.cm.outbox.flush(), 5)
        assert p.seqs() == dict.fromkeys(NODES, 2)
        # (Two if the 40 beats outlasted the linger on a busy machine.)
        assert 1 <= p.sched.calls - calls <= 2
