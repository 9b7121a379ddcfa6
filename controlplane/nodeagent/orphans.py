"""Reaping orphans: instances running on this agent's nodes that no Dispatch
instance routes (its Dispatch crashed with no records to recover from, the
node was declared dead and came back, a delete was lost). Node agents know
what runs; the owning Dispatch knows what is wanted. Every check asks each
owner which instances it routes (``Dispatch.ListInstances``); an instance
unknown to its owner in ``checks`` consecutive checks, and ready for at
least ``grace_s``, is stopped and its resources freed.

``OrphanTracker`` decides (pure, time passed in); ``OrphanReaper`` asks and
acts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import Counter

from controlplane.nodeagent.periodic import Periodic
from controlplane.runtime import rpc
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.revisions import routing_key
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc

if TYPE_CHECKING:
    from controlplane.nodeagent.service import NodeAgentServicer

log = logging.getLogger(__name__)
REAPED = Counter("galaxy_orphan_instances_reaped_total", "Instances no Dispatch routed, stopped")
DISPATCH = common_pb2.CONTROL_KIND_DISPATCH


@dataclass
class OrphanTracker:
    """Which running instances are orphans (pure)."""

    checks: int = 2
    grace_s: float = 30.0
    _unknown: dict[str, int] = field(default_factory=dict)

    def observe(
        self, now: float, running: dict[str, float], known: set[str], asked: set[str]
    ) -> list[str]:
        """One check. running: instance id -> when it became ready; known:
        ids their owners route; asked: ids whose owner answered (the others
        are not judged this time). Returns the ids to stop."""
        out = []
        for iid, ready_at in running.items():
            if iid not in asked:
                continue
            if iid in known:
                self._unknown.pop(iid, None)
                continue
            n = self._unknown[iid] = self._unknown.get(iid, 0) + 1
            if n >= self.checks and now - ready_at >= self.grace_s:
                out.append(iid)
        for gone in set(self._unknown) - set(running):
            del self._unknown[gone]
        for iid in out:
            self._unknown.pop(iid, None)
        return out


class OrphanReaper(Periodic):
    """Runs the checks every period_s for one node agent."""

    name = "orphan check"

    def __init__(
        self,
        servicer: NodeAgentServicer,
        view: Callable[[], MembershipView],
        pool: rpc.ChannelPool,
        period_s: float = 30.0,
        checks: int = 2,
    ) -> None:
        super().__init__()
        self.servicer = servicer
        self.view = view
        self.pool = pool
        self.period_s = period_s
        # Ready for at least one period before it can be judged.
        self.tracker = OrphanTracker(checks=checks, grace_s=period_s)

    async def _known_by(self, address: str) -> set[str] | None:
        try:
            async with self.pool.stub(address, dispatch_pb2_grpc.DispatchStub) as s:
                reply = await s.ListInstances(dispatch_pb2.ListInstancesRequest(), timeout=5.0)
        except Exception as e:
            log.info("orphan check: dispatch %s did not answer: %s", address, e)
            return None
        return {st.instance.instance_id for st in reply.instances}

    async def check(self) -> list[str]:
        """One check; returns the instances stopped."""
        loop = asyncio.get_running_loop()
        running = self.servicer.ready_instances()  # iid -> (node, function, ready_at)
        view = self.view()
        owners: dict[str, set[str]] = {}
        for iid, (_, function, _) in running.items():
            owner = view.owner(DISPATCH, routing_key(function))
            if owner is not None:
                owners.setdefault(owner.address, set()).add(iid)
        answers = await asyncio.gather(*(self._known_by(a) for a in owners))
        known: set[str] = set()
        asked: set[str] = set()
        for (_, iids), got in zip(owners.items(), answers, strict=True):
            if got is not None:
                known |= got
                asked |= iids
        doomed = self.tracker.observe(
            loop.time(), {i: r[2] for i, r in running.items()}, known, asked
        )
        for iid in doomed:
            node_id, function, _ = running[iid]
            log.warning(
                "instance %s of %s on node %s: no Dispatch routes it: stopping it",
                iid, function, node_id,
            )  # fmt: skip
            REAPED.inc()
            await self.servicer.stop_instance(node_id, iid)
        return doomed
