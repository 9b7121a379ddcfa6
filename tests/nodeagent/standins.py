"""Stand-ins for the node agent's peers (Controller, ClusterMgr, Dispatch).

They serve the real API over real gRPC on loopback but implement only the
methods a node agent calls, with no logic of their own, so the agent can be
tested on its own. End-to-end behaviour with the real peers is covered by the
integration tests.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from controlplane import rpc
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
)


async def serve(
    add: Callable[[Any, Any], None], servicer: Any, name: str, listen: str = "127.0.0.1:0"
):
    """Start servicer on a loopback server; returns (server, address)."""
    server, port, _ = rpc.create_server(listen, [(add, servicer, name)])
    await server.start()
    return server, f"127.0.0.1:{port}"


class Watched:
    """Lets a test await a condition on the stand-in's records."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()

    async def _changed(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 5.0) -> None:
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(predicate), within_s)


class ControllerStandIn(controller_pb2_grpc.ControllerServicer, Watched):
    """Answers GetMembership with whatever the test set."""

    def __init__(self) -> None:
        Watched.__init__(self)
        self.membership = common_pb2.Membership(epoch=1)
        self.calls = 0

    def set_clustermgrs(self, addresses: dict[str, str]) -> None:
        """New membership (next epoch) with these ClusterMgr id -> address."""
        self.membership = common_pb2.Membership(
            epoch=self.membership.epoch + 1,
            instances=[
                common_pb2.ControlInstance(id=i, kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=a)
                for i, a in addresses.items()
            ],
        )

    async def GetMembership(self, request, context):
        self.calls += 1
        await self._changed()
        return self.membership


class ClusterMgrStandIn(clustermgr_pb2_grpc.ClusterMgrServicer, Watched):
    """Records RegisterNode/Update; asks unknown nodes to register again."""

    def __init__(self, heartbeat_ms: int = 20) -> None:
        Watched.__init__(self)
        self.heartbeat_ms = heartbeat_ms
        self.known: dict[str, common_pb2.NodeStatus] = {}
        self.registrations: Counter[str] = Counter()
        self.updates: Counter[str] = Counter()
        self.seqs: dict[str, list[int]] = defaultdict(list)
        #: When set, Update never answers (a hung peer, not a dead one).
        self.hang_updates = False

    def forget_all(self) -> None:
        """Behave like a restarted ClusterMgr."""
        self.known.clear()

    async def RegisterNode(self, request, context):
        self.known[request.node_id] = request
        self.registrations[request.node_id] += 1
        self.seqs[request.node_id].append(request.seq)
        await self._changed()
        return clustermgr_pb2.UpdateReply(heartbeat_interval_ms=self.heartbeat_ms)

    async def Update(self, request, context):
        if self.hang_updates:
            await asyncio.Event().wait()  # until the server stops
        self.seqs[request.node_id].append(request.seq)
        if request.node_id not in self.known:
            await self._changed()
            return clustermgr_pb2.UpdateReply(reregister=True)
        self.known[request.node_id] = request
        self.updates[request.node_id] += 1
        await self._changed()
        return clustermgr_pb2.UpdateReply(heartbeat_interval_ms=self.heartbeat_ms)


class DispatchStandIn(dispatch_pb2_grpc.DispatchServicer):
    """Queues every ModInstance it receives."""

    def __init__(self) -> None:
        self.mods: asyncio.Queue[dispatch_pb2.ModInstanceRequest] = asyncio.Queue()

    async def ModInstance(self, request, context):
        await self.mods.put(request)
        return dispatch_pb2.ModInstanceReply(changed=True)


async def serve_controller(s: ControllerStandIn, listen: str = "127.0.0.1:0"):
    return await serve(
        controller_pb2_grpc.add_ControllerServicer_to_server, s, "galaxy.v1.Controller", listen
    )


async def serve_clustermgr(s: ClusterMgrStandIn):
    return await serve(
        clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, s, "galaxy.v1.ClusterMgr"
    )


async def serve_dispatch(s: DispatchStandIn):
    return await serve(dispatch_pb2_grpc.add_DispatchServicer_to_server, s, "galaxy.v1.Dispatch")
