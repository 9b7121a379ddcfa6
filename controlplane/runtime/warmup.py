"""Which nodes a model is warmed on (pure): ``galaxy models warm NAME
--nodes N`` and a spec's ``model.warm: {nodes: N}`` prefetch a model to N
nodes as Fluid's DataLoad warms a cache. The nodes are the ones placement
would pick for the function's next starts: nodes that hold the model (or
are fetching it) count first, then the rest ranked by the placement scoring
term (``model_locality``: the shortest estimated load, then the least
loaded), among the nodes the function fits on.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import NodeInfo, Placing, Score, model_locality


@dataclass(frozen=True)
class WarmPlan:
    """The nodes that hold the model already, and those to fetch it to."""

    holding: tuple[NodeInfo, ...]
    fetch: tuple[NodeInfo, ...]


def plan(
    nodes: list[NodeInfo], placing: Placing, count: int, need: Res, score: Score = model_locality
) -> WarmPlan:
    """Up to ``count`` nodes for ``placing``'s model (fewer when fewer fit)."""
    holding = [n for n in nodes if n.models and placing.model in n.models]
    holding.sort(key=lambda n: n.node_id)
    rest: list[tuple[float, str, NodeInfo]] = []
    for n in nodes:
        if n.models and placing.model in n.models:
            continue
        free = (n.capacity - n.allocated).clamped()
        if need.fits_in(free):
            rest.append((-score(n, free, need, placing), n.node_id, n))
    rest.sort(key=lambda t: (t[0], t[1]))
    want = max(0, count - len(holding))
    return WarmPlan(tuple(holding[:count]), tuple(t[2] for t in rest[:want]))
