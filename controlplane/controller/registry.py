"""Membership of control function instances: a pure object (no I/O).

The controller is the one place that decides membership, so every instance
computes the same rendezvous partitions from the same epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.clock import Clock, MonotonicClock
from galaxy.v1 import common_pb2


@dataclass
class Member:
    """A registered control function instance and its latest load report."""

    info: common_pb2.ControlInstance
    registered_at: float
    last_report_at: float | None = None
    ops_per_second: dict[str, float] = field(default_factory=dict)
    queue_depth: int = 0
    errors: int = 0


class ControlRegistry:
    """Registered instances by (kind, id); every change bumps the epoch."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or MonotonicClock()
        self.epoch = 0
        self._members: dict[tuple[int, str], Member] = {}

    def register(self, info: common_pb2.ControlInstance) -> bool:
        """Add or update an instance; True when membership changed.

        Re-registering with the same address is a no-op (idempotent retries);
        a new address for the same id (a restarted instance) is a change.
        """
        key = (info.kind, info.id)
        cur = self._members.get(key)
        if cur is not None and cur.info.address == info.address:
            return False
        self._members[key] = Member(
            common_pb2.ControlInstance(
                id=info.id,
                kind=info.kind,
                address=info.address,
                metrics_address=info.metrics_address,
            ),
            self.clock.now(),
        )
        self.epoch += 1
        return True

    def deregister(self, kind: int, instance_id: str) -> bool:
        """Remove an instance; True when it was a member."""
        if self._members.pop((kind, instance_id), None) is None:
            return False
        self.epoch += 1
        return True

    def report(
        self, kind: int, instance_id: str, ops: dict[str, float], queue_depth: int, errors: int
    ) -> bool:
        """Record a load report; False when the reporter is not a member."""
        m = self._members.get((kind, instance_id))
        if m is None:
            return False
        m.last_report_at = self.clock.now()
        m.ops_per_second = dict(ops)
        m.queue_depth = queue_depth
        m.errors = errors
        return True

    def members(self, kind: int | None = None) -> list[Member]:
        """Members (of one kind if given), sorted by kind then id."""
        return [self._members[k] for k in sorted(self._members) if kind is None or k[0] == kind]

    def membership(self) -> common_pb2.Membership:
        """The current membership message."""
        return common_pb2.Membership(epoch=self.epoch, instances=[m.info for m in self.members()])
