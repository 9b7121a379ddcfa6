"""`galaxy serve dispatch`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from controlplane.host import HostContext
from controlplane.records import Recorder, add_state_argument
from controlplane.rpc import ChannelPool
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, dispatch_pb2_grpc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Dispatch flags (common ones are added by the CLI)."""
    p.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=300_000,
        help="a slot not Released is reclaimed after this long (default 300000)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=10_000,
        help="requests waiting per function before RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--max-spill",
        type=int,
        default=2,
        help="Schedule instances tried after the owner when it has no room",
    )
    add_state_argument(p)


class DispatchComponent:
    """A Dispatch instance as a host Component."""

    kind = common_pb2.CONTROL_KIND_DISPATCH

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.recorder = Recorder(args.state)
        # Placeholder pool until start() hands over the host's.
        self.servicer = DispatchServicer(
            instance_id=args.id,
            pool=ChannelPool(),
            controller=args.controller,
            lease_ttl_s=args.lease_ttl_ms / 1000.0,
            max_queue=args.max_queue,
            max_spill=args.max_spill,
            record=self.recorder,
        )
        self._housekeeping: asyncio.Task[None] | None = None

    def services(self) -> list[tuple[Any, Any, str]]:
        return [
            (dispatch_pb2_grpc.add_DispatchServicer_to_server, self.servicer, "galaxy.v1.Dispatch")
        ]

    async def start(self, ctx: HostContext) -> None:
        self.servicer.pool = ctx.pool
        self.servicer.address = ctx.address
        self.recorder.start()
        self._housekeeping = asyncio.create_task(self._expire_loop())

    async def _expire_loop(self) -> None:
        # Periodic by nature: reclaims leases of clients that never Released.
        while True:
            await asyncio.sleep(1.0)
            self.servicer.expire_leases()

    def on_membership(self, membership: common_pb2.Membership) -> None:
        self.servicer.membership.update(membership)

    async def stop(self) -> None:
        if self._housekeeping:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        await self.servicer.close()
        await self.recorder.stop()


def build(args: argparse.Namespace) -> DispatchComponent:
    """The Dispatch component from parsed flags."""
    return DispatchComponent(args)
