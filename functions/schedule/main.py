"""`galaxy serve schedule`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.runtime import config
from controlplane.runtime.host import HostContext
from controlplane.runtime.metrics import QUEUE_LIMIT
from functions.schedule import factory
from functions.schedule.config import ScheduleConfig
from functions.schedule.credits import CreditLedger
from functions.schedule.policy import PlacementPolicy
from functions.schedule.service import SERVICE_NAME, ScheduleServicer
from galaxy.v1 import common_pb2, schedule_pb2_grpc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Schedule flags (common ones are added by the CLI), from ``ScheduleConfig``."""
    config.add_arguments(p, ScheduleConfig)


class ScheduleComponent:
    """A Schedule instance as a host Component."""

    kind = common_pb2.CONTROL_KIND_SCHEDULE

    def __init__(
        self,
        policy: PlacementPolicy,
        credits: CreditLedger | None = None,
        *,
        max_pending: int = 10_000,
    ) -> None:
        self.policy = policy
        # The id and the host's pool are bound in start(); until then the
        # servicer holds a private pool it never uses.
        self.servicer = ScheduleServicer(policy, credits=credits, max_pending=max_pending)

    def services(self) -> list[tuple[Any, Any, str]]:
        """The Schedule service."""
        return [(schedule_pb2_grpc.add_ScheduleServicer_to_server, self.servicer, SERVICE_NAME)]

    async def start(self, ctx: HostContext) -> None:
        """Adopt the instance id and the host's channel pool."""
        self.servicer.bind(ctx.instance_id, ctx.pool)

    def on_membership(self, membership: common_pb2.Membership) -> None:
        """Adopt the membership returned by registration."""
        self.servicer.apply_membership(membership)

    def load_counters(self) -> dict[str, int]:
        """Cumulative counts for the load reporter. ``schedule`` counts the
        Schedule requests that arrived: its rate is this instance's SRPS even
        when the instance is saturated and completions lag behind arrivals."""
        s = self.policy.stats
        return {
            "schedule": self.servicer.arrivals,
            "placement": s.placements,
            "probe": s.probes,
            "no_fit": s.no_fit,
        }

    def queue_depth(self) -> int:
        """Placements in progress (probing, creating the instance)."""
        return self.servicer.running

    async def stop(self) -> None:
        """Cancel placements still running."""
        await self.servicer.close()


def build(args: argparse.Namespace) -> ScheduleComponent:
    """The Schedule component from parsed flags."""
    return from_config(config.from_args(ScheduleConfig, args))


def from_config(cfg: ScheduleConfig) -> ScheduleComponent:
    """The Schedule component from its configuration."""
    policy = factory.make_policy(cfg)
    QUEUE_LIMIT.labels("galaxy_schedule_pending").set(cfg.max_pending)
    return ScheduleComponent(policy, factory.make_ledger(cfg, policy), max_pending=cfg.max_pending)
