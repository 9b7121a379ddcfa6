"""`galaxy serve clustermgr`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.runtime import config
from controlplane.runtime.host import HostContext
from functions.clustermgr.config import ClusterMgrConfig
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME, ClusterMgrServicer
from galaxy.v1 import clustermgr_pb2_grpc, common_pb2
from statestore.records import Recorder


def add_arguments(p: argparse.ArgumentParser) -> None:
    """ClusterMgr flags (common ones are added by the CLI), from ``ClusterMgrConfig``."""
    config.add_arguments(p, ClusterMgrConfig)


class ClusterMgrComponent:
    """A ClusterMgr instance as a host Component.

    record: write-behind hook for node records (see ``ClusterMgrServicer``).
    """

    kind = common_pb2.CONTROL_KIND_CLUSTERMGR

    def __init__(
        self,
        registry: NodeRegistry,
        *,
        heartbeat_s: float,
        record: Recorder | None = None,
        covered_linger_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.recorder = record
        # The id and the host's pool are bound in start().
        self.servicer = ClusterMgrServicer(
            registry, heartbeat_s=heartbeat_s, record=record, covered_linger_s=covered_linger_s
        )

    def services(self) -> list[tuple[Any, Any, str]]:
        """The ClusterMgr service."""
        return [(clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, self.servicer, SERVICE_NAME)]

    async def start(self, ctx: HostContext) -> None:
        """Adopt the instance id and pool; arm the liveness timer."""
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
        """Stop the liveness timer and pending ModNode sends."""
        await self.servicer.stop()
        if self.recorder is not None:
            await self.recorder.stop()


def build(args: argparse.Namespace) -> ClusterMgrComponent:
    """The ClusterMgr component from parsed flags."""
    return from_config(config.from_args(ClusterMgrConfig, args))


def from_config(cfg: ClusterMgrConfig) -> ClusterMgrComponent:
    """The ClusterMgr component from its configuration."""
    registry = NodeRegistry(dead_after_s=cfg.dead_after_s)
    return ClusterMgrComponent(
        registry,
        heartbeat_s=cfg.heartbeat_ms / 1000.0,
        record=Recorder(cfg.state, cfg.record_ttl_s),
        covered_linger_s=None if cfg.covered_linger_ms is None else cfg.covered_linger_ms / 1000.0,
    )
