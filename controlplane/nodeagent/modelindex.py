"""What a node's model cache holds, and what to evict (pure: no I/O, an
injected clock).

Tiers are ordered fastest first (``memory``, then ``disk``), each with a byte
capacity. An entry is one model (by digest) in one tier; the same model may
be in both. Eviction is least-recently-used among entries no instance is
using (pinned entries are never evicted); if the room cannot be made, the
plan says so and the caller refuses (the memory tier is then skipped, the
disk tier refuses the start with RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.runtime.scoring import MODELS_PER_NODE

#: At most this many models are reported to placement per node (the most
#: recently used): heartbeats stay small whatever the cache holds.
REPORT_LIMIT = MODELS_PER_NODE


@dataclass
class Entry:
    """One model in one tier."""

    digest: str
    tier: str
    size: int
    last_used: float
    pins: int = 0


@dataclass
class ModelIndex:
    """The cache's books: entries by (tier, digest), capacities by tier."""

    capacities: dict[str, int]
    clock: Callable[[], float]
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)

    def tiers(self) -> list[str]:
        """Tier names, fastest first (the order of ``capacities``)."""
        return list(self.capacities)

    def held(self, tier: str) -> int:
        """Bytes held in a tier."""
        return sum(e.size for (t, _), e in self.entries.items() if t == tier)

    def find(self, digest: str) -> Entry | None:
        """The fastest tier's entry of a model, if cached anywhere."""
        for tier in self.tiers():
            e = self.entries.get((tier, digest))
            if e is not None:
                return e
        return None

    def get(self, tier: str, digest: str) -> Entry | None:
        """The entry of a model in one tier."""
        return self.entries.get((tier, digest))

    def plan_room(self, tier: str, size: int) -> list[Entry] | None:
        """Unpinned entries to evict (least recently used first) so that
        ``size`` more bytes fit in ``tier``; None when even evicting every
        unpinned entry would not make room (or the model is larger than the
        tier)."""
        cap = self.capacities[tier]
        if size > cap:
            return None
        need = self.held(tier) + size - cap
        if need <= 0:
            return []
        victims: list[Entry] = []
        for e in sorted(
            (e for (t, _), e in self.entries.items() if t == tier and e.pins == 0),
            key=lambda e: e.last_used,
        ):
            victims.append(e)
            need -= e.size
            if need <= 0:
                return victims
        return None

    def add(self, digest: str, tier: str, size: int) -> Entry:
        """Record a published model (its room was planned)."""
        e = Entry(digest, tier, size, self.clock())
        self.entries[(tier, digest)] = e
        return e

    def remove(self, entry: Entry) -> None:
        """Forget an evicted entry."""
        self.entries.pop((entry.tier, entry.digest), None)

    def pin(self, entry: Entry) -> None:
        """An instance uses this entry's file: never evict it until unpinned."""
        entry.pins += 1
        entry.last_used = self.clock()

    def unpin(self, entry: Entry) -> None:
        """An instance that used it ended."""
        entry.pins = max(0, entry.pins - 1)
        entry.last_used = self.clock()

    def report(self, limit: int = REPORT_LIMIT) -> list[Entry]:
        """What placement hears of: the fastest tier of each model, the most
        recently used first, at most ``limit``."""
        best: dict[str, Entry] = {}
        for tier in reversed(self.tiers()):  # faster tiers overwrite slower
            for (t, digest), e in self.entries.items():
                if t == tier:
                    best[digest] = e
        return sorted(best.values(), key=lambda e: -e.last_used)[:limit]
