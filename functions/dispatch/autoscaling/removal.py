"""Which idle function instances to remove when the autoscaler scales down
(``functions.dispatch.autoscaling.kpa`` re-exports these). Pure, no I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["InstanceView", "RemovalCandidate", "idle_instances_to_remove"]


class RemovalCandidate(Protocol):
    """An instance as the removal helper needs it (read-only);
    ``functions.dispatch.policy.Instance`` fits as is."""

    @property
    def instance_id(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def added_at(self) -> float: ...
    @property
    def draining(self) -> bool: ...


@dataclass(frozen=True)
class InstanceView:
    """A plain ``RemovalCandidate`` (for the simulator and tests)."""

    instance_id: str
    in_flight: int
    added_at: float
    draining: bool = False


def idle_instances_to_remove(
    instances: Iterable[RemovalCandidate],
    count: int,
    idle_since: Mapping[str, float] | None = None,
) -> list[str]:
    """Ids of up to ``count`` instances to drain and then delete.

    Never one with requests in flight, never one already draining. The most
    recently added go first so the older, warm ones stay (the Dispatch router
    packs load on the oldest instance, so the newest are the ones going
    idle); among equals, the one idle longest (``idle_since``), then by id so
    the choice is deterministic. May return fewer than ``count`` when not
    enough instances are idle; ask again next tick.
    """
    if count <= 0:
        return []
    since = idle_since or {}
    idle = [i for i in instances if i.in_flight == 0 and not i.draining]
    idle.sort(key=lambda i: (-i.added_at, since.get(i.instance_id, math.inf), i.instance_id))
    return [i.instance_id for i in idle[:count]]
