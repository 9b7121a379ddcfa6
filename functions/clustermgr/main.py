"""`galaxy serve clustermgr`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.runtime.host import HostContext
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME, ClusterMgrServicer
from galaxy.v1 import clustermgr_pb2_grpc, common_pb2
from statestore.records import Recorder, add_state_argument


def _positive(s: str) -> float:
    v = float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """ClusterMgr flags (common ones are added by the CLI)."""
    p.add_argument(
        "--heartbeat-ms",
        type=_positive,
        default=1000.0,
        help="heartbeat interval told to node agents, milliseconds (default 1000)",
    )
    p.add_argument(
        "--dead-after-ms",
        type=_positive,
        default=None,
        help="a node silent this long is declared dead, milliseconds "
        "(default 3 x --heartbeat-ms, i.e. 3000)",
    )
    add_state_argument(p)


class ClusterMgrComponent:
    """A ClusterMgr instance as a host Component.

    record: write-behind hook for node records (see ``ClusterMgrServicer``).
    """

    kind = common_pb2.CONTROL_KIND_CLUSTERMGR

    def __init__(
        self, registry: NodeRegistry, *, heartbeat_s: float, record: Recorder | None = None
    ) -> None:
        self.registry = registry
        self.recorder = record
        # The id and the host's pool are bound in start().
        self.servicer = ClusterMgrServicer(registry, heartbeat_s=heartbeat_s, record=record)

    def services(self) -> list[tuple[Any, Any, str]]:
        """The ClusterMgr service."""
        return [(clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, self.servicer, SERVICE_NAME)]

    async def start(self, ctx: HostContext) -> None:
        """Adopt the instance id and pool; start the liveness loop."""
        self.servicer.bind(ctx.instance_id, ctx.pool)
        if self.recorder is not None:
            self.recorder.start()
        await self.servicer.start()

    def on_membership(self, membership: common_pb2.Membership) -> None:
        """Adopt the membership returned by registration."""
        self.servicer.apply_membership(membership)

    def load_counters(self) -> dict[str, int]:
        """Cumulative counts for the load reporter: node_update (heartbeats
        and registrations answered) and modnode (messages sent to Schedule)."""
        return {
            "node_update": self.servicer.node_updates,
            "modnode": self.servicer.outbox.sent,
        }

    async def stop(self) -> None:
        """Stop the liveness loop and pending ModNode sends."""
        await self.servicer.stop()
        if self.recorder is not None:
            await self.recorder.stop()


def build(args: argparse.Namespace) -> ClusterMgrComponent:
    """The ClusterMgr component from parsed flags."""
    dead_after_ms = args.dead_after_ms or 3 * args.heartbeat_ms
    registry = NodeRegistry(dead_after_s=dead_after_ms / 1000.0)
    return ClusterMgrComponent(
        registry, heartbeat_s=args.heartbeat_ms / 1000.0, record=Recorder(args.state)
    )
