"""Placement scoring terms, by name, shared by the two places a node is
chosen for a new instance: Schedule's placement (``functions.schedule``) and
a Dispatch start that uses a capacity credit (``functions.dispatch.credits``,
which ranks the nodes where it holds credit with the same terms).

A term scores one candidate node for one placement: ``(node, free estimate,
need, function) -> float``, higher is better. A new term (a model-cache
locality term, say) is one function registered here plus one config value
(``ScheduleConfig.scoring``, ``DispatchConfig.scoring``). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controlplane.runtime.resources import Res

ZERO = Res()


@dataclass
class NodeInfo:
    """A node's status as reported (ModNode or a probe answer)."""

    node_id: str
    address: str
    capacity: Res
    allocated: Res = ZERO
    seq: int = 0
    instances: int = 0
    #: the part of allocated held by instances still starting
    starting: Res = ZERO


#: Scores a candidate: (node, free estimate, need, function being placed)
#: -> higher is better. Terms are registered by name here (``register``).
Score = Callable[[NodeInfo, Res, Res, str], float]


def least_loaded(node: NodeInfo, free: Res, need: Res, function: str = "") -> float:
    """Default score: the free fraction left on the node's tightest resource
    after placing ``need`` (spreads load; ties go to the first sampled)."""
    # min over the resources the node has of (free - need) / capacity,
    # written out: it is computed for every candidate of every placement.
    cap = node.capacity
    best: float | None = None
    if cap.cpu_millis > 0:
        best = (free.cpu_millis - need.cpu_millis) / cap.cpu_millis
    if cap.memory_mib > 0:
        f = (free.memory_mib - need.memory_mib) / cap.memory_mib
        if best is None or f < best:
            best = f
    if cap.gpus > 0:
        f = (free.gpus - need.gpus) / cap.gpus
        if best is None or f < best:
            best = f
    return 0.0 if best is None else best


SCORES: dict[str, Score] = {"least_loaded": least_loaded}


def register(name: str) -> Callable[[Score], Score]:
    """Decorator: make ``fn`` the scoring term called ``name``."""

    def add(fn: Score) -> Score:
        if name in SCORES and SCORES[name] is not fn:
            raise ValueError(f"scoring term {name!r} is already registered")
        SCORES[name] = fn
        return fn

    return add


def lookup(name: str) -> Score:
    """The term called ``name``; ``ValueError`` listing the known ones."""
    try:
        return SCORES[name]
    except KeyError:
        known = ", ".join(sorted(SCORES))
        raise ValueError(f"unknown scoring term {name[:40]!r} (known: {known})") from None
