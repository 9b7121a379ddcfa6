"""Registration and heartbeats against stand-in Controller and ClusterMgr
servers (real gRPC on loopback; see standins.py)."""

from __future__ import annotations

import asyncio
import socket

from controlplane.membership import MembershipView
from controlplane.nodeagent.capacity import Res
from controlplane.nodeagent.registration import Registrar
from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import NodeAgentServicer
from galaxy.v1 import common_pb2

from .standins import ClusterMgrStandIn, ControllerStandIn, serve_clustermgr, serve_controller


def owners(ids: list[str], cmfs: dict[str, str]) -> dict[str, str]:
    """node id -> owning ClusterMgr id, as the agent must compute it."""
    view = MembershipView()
    view.update(
        common_pb2.Membership(
            epoch=1,
            instances=[
                common_pb2.ControlInstance(id=i, kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=a)
                for i, a in cmfs.items()
            ],
        )
    )
    out = {}
    for n in ids:
        o = view.owner(common_pb2.CONTROL_KIND_CLUSTERMGR, n)
        assert o is not None
        out[n] = o.id
    return out


class Harness:
    def __init__(self) -> None:
        self.servers: list = []
        self.registrars: list[Registrar] = []

    async def clustermgr(self, heartbeat_ms: int = 20) -> tuple[ClusterMgrStandIn, str]:
        cm = ClusterMgrStandIn(heartbeat_ms)
        server, addr = await serve_clustermgr(cm)
        self.servers.append(server)
        return cm, addr

    async def controller(self, listen: str = "127.0.0.1:0") -> tuple[ControllerStandIn, str]:
        ctl = ControllerStandIn()
        server, addr = await serve_controller(ctl, listen)
        self.servers.append(server)
        return ctl, addr

    def registrar(self, n: int, controller: str, pool, **kw) -> tuple[Registrar, NodeAgentServicer]:
        servicer = NodeAgentServicer(
            [(f"node-{i}", Res(1000, 1000, 0)) for i in range(n)], EmulatedBackend()
        )
        servicer.attach("127.0.0.1:9")
        kw.setdefault("membership_refresh_s", 0.05)
        reg = Registrar(list(servicer.nodes), servicer.heartbeat_status, controller, pool, **kw)
        self.registrars.append(reg)
        return reg, servicer

    async def close(self) -> None:
        for r in self.registrars:
            await r.stop()
        for s in self.servers:
            await s.stop(None)


async def test_pool_registers_with_owners_and_heartbeats(pool):
    h = Harness()
    try:
        (cm_a, addr_a), (cm_b, addr_b) = await h.clustermgr(), await h.clustermgr()
        ctl, caddr = await h.controller()
        ctl.set_clustermgrs({"cm-a": addr_a, "cm-b": addr_b})
        reg, servicer = h.registrar(50, caddr, pool)
        await reg.start()
        await asyncio.wait_for(reg.registered.wait(), 5)
        ids = list(servicer.nodes)
        want = owners(ids, {"cm-a": addr_a, "cm-b": addr_b})
        assert set(cm_a.registrations) == {n for n in ids if want[n] == "cm-a"}
        assert set(cm_b.registrations) == {n for n in ids if want[n] == "cm-b"}
        assert all(c == 1 for c in (cm_a.registrations + cm_b.registrations).values())
        status = cm_a.known[next(iter(cm_a.known))]
        assert status.address == "127.0.0.1:9" and status.capacity.cpu_millis == 1000
        # Heartbeats at the interval the ClusterMgr asked for (20 ms), every node.
        for cm in (cm_a, cm_b):
            await cm.wait_for(
                lambda cm=cm: (
                    len(cm.updates) == len(cm.registrations) and min(cm.updates.values()) >= 3
                )
            )
        for cm in (cm_a, cm_b):
            for node, seqs in cm.seqs.items():
                assert seqs == sorted(set(seqs)), f"seq not increasing for {node}"
    finally:
        await h.close()


async def test_reregisters_when_clustermgr_forgets(pool):
    h = Harness()
    try:
        cm, addr = await h.clustermgr()
        ctl, caddr = await h.controller()
        ctl.set_clustermgrs({"cm": addr})
        reg, _ = h.registrar(5, caddr, pool)
        await reg.start()
        await asyncio.wait_for(reg.registered.wait(), 5)
        cm.forget_all()  # as after a ClusterMgr restart
        await cm.wait_for(lambda: len(cm.known) == 5 and min(cm.registrations.values()) == 2)
    finally:
        await h.close()


async def test_waits_for_a_clustermgr_then_registers(pool):
    h = Harness()
    try:
        ctl, caddr = await h.controller()  # membership without any ClusterMgr
        reg, _ = h.registrar(3, caddr, pool)
        await reg.start()
        await ctl.wait_for(lambda: ctl.calls >= 2)  # it keeps asking
        assert not reg.registered.is_set()
        cm, addr = await h.clustermgr()
        ctl.set_clustermgrs({"cm": addr})
        await asyncio.wait_for(reg.registered.wait(), 5)
        assert len(cm.registrations) == 3
    finally:
        await h.close()


async def test_survives_controller_down_at_start(pool):
    h = Harness()
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        reg, _ = h.registrar(2, f"127.0.0.1:{port}", pool, max_backoff_s=0.1)
        await reg.start()
        _cm, addr = await h.clustermgr()
        ctl, _ = await h.controller(f"127.0.0.1:{port}")  # comes up late
        ctl.set_clustermgrs({"cm": addr})
        await asyncio.wait_for(reg.registered.wait(), 5)
    finally:
        await h.close()


async def test_moves_nodes_when_a_clustermgr_joins(pool):
    h = Harness()
    try:
        _cm_a, addr_a = await h.clustermgr()
        ctl, caddr = await h.controller()
        ctl.set_clustermgrs({"cm-a": addr_a})
        reg, servicer = h.registrar(20, caddr, pool)
        await reg.start()
        await asyncio.wait_for(reg.registered.wait(), 5)
        cm_b, addr_b = await h.clustermgr()
        ctl.set_clustermgrs({"cm-a": addr_a, "cm-b": addr_b})
        want = owners(list(servicer.nodes), {"cm-a": addr_a, "cm-b": addr_b})
        moved = {n for n, o in want.items() if o == "cm-b"}
        assert moved  # 20 nodes over 2 owners: some move
        await cm_b.wait_for(lambda: set(cm_b.known) == moved)
    finally:
        await h.close()


async def test_clustermgr_down_then_back(pool):
    h = Harness()
    try:
        _cm, addr = await h.clustermgr()
        ctl, caddr = await h.controller()
        ctl.set_clustermgrs({"cm": addr})
        reg, _ = h.registrar(4, caddr, pool, max_backoff_s=0.1)
        await reg.start()
        await asyncio.wait_for(reg.registered.wait(), 5)
        # Replace the ClusterMgr by a new one at a new address; the old one dies.
        await h.servers.pop(0).stop(None)
        cm2, addr2 = await h.clustermgr()
        ctl.set_clustermgrs({"cm": addr2})
        await cm2.wait_for(lambda: len(cm2.known) == 4 and len(cm2.updates) == 4)
    finally:
        await h.close()


async def test_hung_clustermgr_delays_no_other_node(pool):
    h = Harness()
    try:
        (cm_a, addr_a), (cm_b, addr_b) = await h.clustermgr(), await h.clustermgr()
        ctl, caddr = await h.controller()
        ctl.set_clustermgrs({"cm-a": addr_a, "cm-b": addr_b})
        reg, _ = h.registrar(20, caddr, pool, rpc_timeout_s=30.0)
        await reg.start()
        await asyncio.wait_for(reg.registered.wait(), 5)
        cm_b.hang_updates = True
        start = dict(cm_a.updates)
        # cm-a's nodes keep their 20 ms heartbeat while cm-b's calls hang.
        await cm_a.wait_for(
            lambda: all(cm_a.updates[n] >= start.get(n, 0) + 5 for n in cm_a.registrations)
        )
    finally:
        await h.close()
