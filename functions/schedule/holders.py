"""Which nodes of a Schedule partition hold which models (pure): the
``model_locality`` term can only prefer a node that holds a function's
model if that node is among the candidates it scores, and power-of-d
sampling draws d nodes at random. So a placement of a function with a model
adds the nodes that hold it (at most ``d`` of them, most recently reported
first) to its sampled candidates; the term then weighs their load time
against the load of the others. Functions without a model are placed as
before (no index lookup, no extra random draw).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from controlplane.runtime.scoring import Placing

if TYPE_CHECKING:
    from functions.schedule.model import Placement
    from functions.schedule.policy import PlacementPolicy

Models = Mapping[str, tuple[str, int]] | None


class ModelHolders:
    """digest -> the nodes reporting it (any tier, ``fetching`` included),
    and the model's size as last reported."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, None]] = {}
        self._size: dict[str, int] = {}

    def update(self, node_id: str, old: Models, new: Models) -> None:
        """A node's models went from ``old`` to ``new`` (None: none)."""
        if old == new:
            return
        for digest in old or ():
            if not new or digest not in new:
                held = self._nodes.get(digest)
                if held is not None:
                    held.pop(node_id, None)
                    if not held:
                        del self._nodes[digest]
                        self._size.pop(digest, None)
        for digest, (_, size) in (new or {}).items():
            self._nodes.setdefault(digest, {})[node_id] = None
            if size > 0:
                self._size[digest] = size

    def of(self, digest: str) -> list[str]:
        """The nodes that report ``digest``, the latest to report it last."""
        return list(self._nodes.get(digest, ()))

    def size(self, digest: str) -> int:
        """The model's size as a node reported it (0: no node holds it)."""
        return self._size.get(digest, 0)


def add_holders(
    policy: PlacementPolicy, pl: Placement, fresh: list[str], stale: list[str], now: float
) -> tuple[list[str], list[str]]:
    """``fresh`` and ``stale`` candidates plus up to ``policy.d`` nodes that
    hold ``pl``'s model and fit its need, classified as the policy's mode
    classifies a sampled node (known free capacity, or a probe first)."""
    want = pl.function
    if not isinstance(want, Placing) or not want.model:
        return fresh, stale
    have = set(fresh) | set(stale) | pl.excluded
    added = 0
    for nid in reversed(policy.holders.of(want.model)):
        if added >= policy.d:
            break
        n = policy._nodes.get(nid)
        if n is None or nid in have:
            continue
        if policy.exact:
            if not n.exact_fits(pl.need):
                continue
            known = not n.uncertain or (
                policy.probe_cache and policy._fresh(n, now) and n.cached_fits(pl.need)
            )
        elif policy.probe_cache and policy._fresh(n, now):
            if not n.cached_fits(pl.need):
                continue
            known = True
        else:
            if not n.status_fits(pl.need):
                continue
            known = False
        (fresh if known else stale).append(nid)
        added += 1
    return fresh, stale
