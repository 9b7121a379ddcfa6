"""`galaxy serve controller`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.registry import ControlRegistry
from controlplane.controller.service import ControllerServicer
from controlplane.host import HostContext
from galaxy.v1 import common_pb2, controller_pb2_grpc
from statestore import StateStore, open_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Controller flags (common ones are added by the CLI)."""
    p.add_argument(
        "--state",
        default="memory://",
        help="state store URL: memory:// (embedded, default) or etcd://host:port[,host:port]",
    )


class ControllerComponent:
    """The controller as a host Component (it does not register with itself)."""

    kind = 0
    name = "controller"

    def __init__(self, state_url: str) -> None:
        self.state_url = state_url
        self.store: StateStore | None = None
        self.servicer: ControllerServicer | None = None

    def services(self) -> list[tuple[Any, Any, str]]:
        if self.servicer is None:
            self.store = open_store(self.state_url)
            # The pool is replaced with the host's in start(); the servicer
            # must exist before the server is built.
            from controlplane.rpc import ChannelPool

            self.servicer = ControllerServicer(
                ControlRegistry(), FunctionStore(self.store), ChannelPool()
            )
        return [
            (
                controller_pb2_grpc.add_ControllerServicer_to_server,
                self.servicer,
                "galaxy.v1.Controller",
            )
        ]

    async def start(self, ctx: HostContext) -> None:
        assert self.servicer is not None
        self.servicer.pool = ctx.pool
        self.servicer.start()
        ctx.extra["state"] = self.state_url

    def on_membership(self, membership: common_pb2.Membership) -> None:
        """Not registered, so never called."""

    async def stop(self) -> None:
        if self.servicer:
            await self.servicer.stop()
        if self.store:
            await self.store.close()


def build(args: argparse.Namespace) -> ControllerComponent:
    """The controller component from parsed flags."""
    return ControllerComponent(args.state)
