"""Sleeping LLM instances: a tier between warm and cold (pure: no I/O).

A sleeping instance keeps its weights loaded (mapped, page cache warm) but
holds no context or KV cache (realhost); a request wakes it in well under
the time a cold start takes (figures: docs/llm.md, "Real KV transfer and
sleeping instances"). This object decides which instances sleep, wake and
go; whoever scales the function performs it:

- scale-in: an instance to give up is put to sleep (``POST
  /v1/galaxy/sleep``) instead of removed, while fewer than ``max_asleep``
  sleep; otherwise it is removed;
- scale-out: ``wake(n)`` names up to n sleeping instances to route to (a
  request wakes them) before any cold start;
- an instance asleep for ``keep_asleep_s`` is removed (``expired``): its
  memory (weights, process) goes back to the node; the time counts from
  when the instance fell asleep, also across a restart of its owner (the
  instance reports how long it has slept).
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


class Step(enum.Enum):
    """What to do with an instance the autoscaler gives up."""

    SLEEP = "sleep"
    REMOVE = "remove"


@dataclass
class SleepPolicy:
    """Which instances of one LLM function sleep, wake or are removed."""

    keep_asleep_s: float = 300.0
    max_asleep: int = 2
    clock: Callable[[], float] = time.monotonic
    #: instance id -> when it fell asleep, oldest first
    asleep: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.keep_asleep_s < 0 or self.max_asleep < 0:
            raise ValueError("keep_asleep_s and max_asleep: not negative")

    def scale_in(self, instance_id: str, asleep_s: float = 0.0) -> Step:
        """The autoscaler gives this awake instance up: sleep it, or remove
        it when ``max_asleep`` already sleep. ``asleep_s``: how long it has
        slept already (an instance a restarted owner finds asleep says so
        itself), counted toward ``keep_asleep_s``."""
        if instance_id in self.asleep:
            raise ValueError(f"instance {instance_id!r} is already asleep")
        if asleep_s < 0:
            raise ValueError("asleep_s: not negative")
        if len(self.asleep) >= self.max_asleep:
            return Step.REMOVE
        self.asleep[instance_id] = self.clock() - asleep_s
        return Step.SLEEP

    def wake(self, n: int) -> list[str]:
        """Up to n sleeping instances to serve again, most recently asleep
        first (the likeliest to still have their pages resident)."""
        woken = list(reversed(self.asleep))[: max(0, n)]
        for i in woken:
            del self.asleep[i]
        return woken

    def expired(self) -> list[str]:
        """Instances asleep for ``keep_asleep_s`` or longer: remove them."""
        limit = self.clock() - self.keep_asleep_s
        gone = [i for i, since in self.asleep.items() if since <= limit]
        for i in gone:
            del self.asleep[i]
        return gone

    def forget(self, instance_id: str) -> None:
        """The instance is gone (it exited or its node did)."""
        self.asleep.pop(instance_id, None)
