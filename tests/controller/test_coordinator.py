"""Membership pushes: only instances whose partition or downstream set
changed get a Coordinate, and a new Schedule instance is shown to Dispatch
only after it holds the nodes of its partition (it warmed its cache)."""

from __future__ import annotations

import asyncio

from controlplane.controller.actuators.base import NoActuator
from controlplane.runtime import rendezvous
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    controller_pb2_grpc,
    dispatch_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)
from tests.controller.conftest import Controller, serve

D, S, C = (
    common_pb2.CONTROL_KIND_DISPATCH,
    common_pb2.CONTROL_KIND_SCHEDULE,
    common_pb2.CONTROL_KIND_CLUSTERMGR,
)
NODES = [f"node-{i}" for i in range(40)]


class StandIn(
    dispatch_pb2_grpc.DispatchServicer,
    schedule_pb2_grpc.ScheduleServicer,
    clustermgr_pb2_grpc.ClusterMgrServicer,
):
    """Records Coordinate calls. As ClusterMgr it knows NODES and, like the
    real one, hands a Schedule instance its nodes when it learns of it."""

    def __init__(self, iid: str, kind: int, log: list) -> None:
        self.iid, self.kind, self.log = iid, kind, log
        self.views: list[list[str]] = []
        self.held: set[str] = set()
        self.peers: dict[str, StandIn] = {}
        self.tasks: set[asyncio.Future] = set()

    async def Coordinate(self, request, context):
        ids = sorted(i.id for i in request.membership.instances)
        self.views.append(ids)
        self.log.append((self.iid, ids))
        if self.kind == C:  # send each Schedule instance its partition, a bit later
            owners = [i.id for i in request.membership.instances if i.kind == S]

            async def hand_over():
                await asyncio.sleep(0.05)  # ModNode messages take a moment to arrive
                for sid in owners:
                    sf = self.peers.get(sid)
                    if sf is not None:
                        sf.held = {n for n in NODES if rendezvous.owner(n, owners) == sid}

            self.tasks.add(asyncio.ensure_future(hand_over()))
        return common_pb2.CoordinateReply(epoch=request.membership.epoch)

    async def ListNodes(self, request, context):
        if self.kind == C:
            return clustermgr_pb2.ListClusterNodesReply(
                nodes=[
                    clustermgr_pb2.ClusterNode(status=common_pb2.NodeStatus(node_id=n), alive=True)
                    for n in NODES
                ]
            )
        return schedule_pb2.ListNodesReply(
            nodes=[common_pb2.NodeStatus(node_id=n) for n in sorted(self.held)]
        )


async def start(ctl, peers, log, iid, kind):
    s = StandIn(iid, kind, log)
    s.peers = peers
    peers[iid] = s
    add = {
        D: dispatch_pb2_grpc.add_DispatchServicer_to_server,
        S: schedule_pb2_grpc.add_ScheduleServicer_to_server,
        C: clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server,
    }[kind]
    name = {D: "galaxy.v1.Dispatch", S: "galaxy.v1.Schedule", C: "galaxy.v1.ClusterMgr"}[kind]
    server, addr = await serve(add, s, name)
    async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as stub:
        await stub.RegisterInstance(common_pb2.ControlInstance(id=iid, kind=kind, address=addr))
    return s, server


async def settle(ctl):
    # Every push round and warm-up started so far has finished.
    for _ in range(3):
        await asyncio.gather(*ctl.coordinator._tasks, return_exceptions=True)
        await ctl.coordinator.sync()


async def test_pushes_go_only_where_the_view_changed_and_schedule_warms_first():
    ctl = await Controller(NoActuator(), enabled=False).start()
    ctl.coordinator.start()
    peers: dict[str, StandIn] = {}
    log: list = []
    servers = []
    try:
        for iid, kind in (("c-0", C), ("s-0", S), ("d-0", D)):
            servers.append((await start(ctl, peers, log, iid, kind))[1])
            await settle(ctl)
        assert peers["s-0"].held == set(NODES)  # ClusterMgr handed it everything

        # A new Dispatch instance: Dispatch partitions change, and ClusterMgr
        # (which tells Dispatch about dead nodes) gets a new downstream set;
        # Schedule is not told. d-1 got its view in the registration reply.
        log.clear()
        servers.append((await start(ctl, peers, log, "d-1", D))[1])
        await settle(ctl)
        assert sorted(who for who, _ in log) == ["c-0", "d-0"], log

        # A new Schedule instance: ClusterMgr and Schedule learn of it first,
        # Dispatch only once it holds its nodes.
        log.clear()
        servers.append((await start(ctl, peers, log, "s-1", S))[1])
        await settle(ctl)
        who = [w for w, _ in log]
        assert set(who) == {"c-0", "s-0", "d-0", "d-1"}
        first_dispatch = min(i for i, w in enumerate(who) if w.startswith("d-"))
        assert who.index("c-0") < first_dispatch and who.index("s-0") < first_dispatch
        expected = {n for n in NODES if rendezvous.owner(n, ["s-0", "s-1"]) == "s-1"}
        assert expected and peers["s-1"].held == expected
        assert all("s-1" in ids for w, ids in log if w.startswith("d-"))
        assert ctl.registry.membership().epoch == ctl.registry.epoch
        assert [i.id for i in ctl.registry.membership().instances] == [
            "d-0",
            "d-1",
            "s-0",
            "s-1",
            "c-0",
        ]  # fmt: skip (by kind, then id)
    finally:
        await ctl.stop()
        for s in servers:
            await s.stop(None)
