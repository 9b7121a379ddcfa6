"""Helpers for controller tests: a real controller servicer on a loopback
gRPC server, and stand-in control function servers that answer Coordinate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.controller.actions import Changes, Timeouts
from controlplane.controller.actuators.base import Actuator
from controlplane.controller.coordinator import Coordinator
from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.reconcile import Reconciler
from controlplane.controller.registry import WARM_AUDIENCE, ControlRegistry
from controlplane.controller.scaling import KindLimits, ScalingConfig
from controlplane.controller.service import ControllerServicer
from controlplane.runtime import rpc
from galaxy.v1 import (
    common_pb2,
    controller_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)
from statestore import MemoryStore


class ScheduleStandIn(schedule_pb2_grpc.ScheduleServicer):
    """Answers Coordinate and ListNodes like a Schedule instance with no nodes."""

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.memberships: list[common_pb2.Membership] = []
        self.got = asyncio.Event()

    async def Coordinate(self, request, context):
        self.memberships.append(request.membership)
        self.got.set()
        return common_pb2.CoordinateReply(epoch=request.membership.epoch)

    async def ListNodes(self, request, context):
        return schedule_pb2.ListNodesReply(schedule_id=self.sid)


async def serve(add, servicer, name):
    server, port, _ = rpc.create_server("127.0.0.1:0", [(add, servicer, name)])
    await server.start()
    return server, f"127.0.0.1:{port}"


class Controller:
    """A real ControllerServicer + Reconciler served on loopback."""

    def __init__(
        self,
        actuator: Actuator,
        *,
        t_sf: float = 100.0,
        enabled: bool = True,
        timeouts: Timeouts | None = None,
        **cfg: Any,
    ) -> None:
        self.changes = Changes()
        self.registry = ControlRegistry(warm_kinds=WARM_AUDIENCE, on_change=self.changes.notify)
        self.pool = rpc.ChannelPool()
        self.coordinator = Coordinator(self.registry, self.pool, warm_timeout_s=2.0)
        base = dict(scale_out_cooldown_s=0.0, scale_in_cooldown_s=1.0)
        base.update(cfg)
        self.config = ScalingConfig(
            limits={"schedule": KindLimits(t_sf, 1, 4)},
            **base,  # type: ignore[arg-type]
        )
        self.reconciler = Reconciler(
            self.registry,
            self.coordinator,
            actuator,
            self.config,
            self.changes,
            enabled=enabled,
            tick_s=0.1,
            timeouts=timeouts or Timeouts(register_s=30, drain_grace_s=0.2, drain_s=5),
        )
        self.servicer = ControllerServicer(
            self.registry,
            FunctionStore(MemoryStore()),
            self.pool,
            coordinator=self.coordinator,
            reconciler=self.reconciler,
        )
        self.server = None
        self.address = ""

    async def start(self) -> Controller:
        self.server, self.address = await serve(
            controller_pb2_grpc.add_ControllerServicer_to_server,
            self.servicer,
            "galaxy.v1.Controller",
        )
        self.servicer.address = self.address
        self.servicer.start()
        return self

    async def stop(self) -> None:
        await self.reconciler.stop()
        await self.servicer.stop()
        await self.pool.close()
        if self.server is not None:
            await self.server.stop(None)


@pytest.fixture
def anyio_backend():
    return "asyncio"
