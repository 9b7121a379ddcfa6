"""Placement scoring terms, by name, shared by the two places a node is
chosen for a new instance: Schedule's placement (``functions.schedule``) and
a Dispatch start that uses a capacity credit (``functions.dispatch.credits``,
which ranks the nodes where it holds credit with the same terms).

A term scores one candidate node for one placement: ``(node, free estimate,
need, placing) -> float``, higher is better, where ``placing`` is the
function's name or a ``Placing`` (the name and the model it needs). A new
term is one function registered here plus one config value
(``ScheduleConfig.scoring``, ``DispatchConfig.scoring``). Pure, no I/O.

``model_locality`` adds a model's estimated load time on the node to
``least_loaded``: see ``ModelLocality``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    #: models in the node's cache: digest -> (tier, bytes); tier "memory",
    #: "disk", or "fetching" (on its way from the store: the fetch queue).
    #: Bounded by what the node reports (NodeStatus.models, at most 64).
    models: Mapping[str, tuple[str, int]] | None = None

    def fetching_bytes(self) -> int:
        """Bytes the node is fetching from model stores now (its fetch queue)."""
        if not self.models:
            return 0
        return sum(size for tier, size in self.models.values() if tier == FETCHING)


#: At most this many models per node reach placement (NodeStatus.models).
MODELS_PER_NODE = 64

#: The tier name of a model a node is still fetching.
FETCHING = "fetching"


@dataclass(frozen=True)
class Placing:
    """What is being placed, for terms that need more than the function's
    name: the model it starts with (cache key, size in bytes; "" / 0 when
    the function names no model or its size is not known)."""

    function: str
    model: str = ""
    model_bytes: int = 0

    def __str__(self) -> str:
        return self.function


#: Scores a candidate: (node, free estimate, need, what is being placed:
#: the function's name or a ``Placing``) -> higher is better. Terms are
#: registered by name here (``register``).
Score = Callable[[NodeInfo, Res, Res, "str | Placing"], float]


def least_loaded(node: NodeInfo, free: Res, need: Res, function: str | Placing = "") -> float:
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


@dataclass(frozen=True)
class ModelLocality:
    """The ``model_locality`` term: an instance's estimated model load time
    on the node, as ServerlessLLM (OSDI'24) places by estimated startup
    time, traded against ``least_loaded``.

    Load time: the model's bytes / the bandwidth of the fastest tier holding
    them (memory, disk), or, when the node does not hold them, (the node's
    fetch queue + the model's bytes) / the store link's bandwidth: fetches
    share the node's link, so a model waits for the bytes ahead of it. A
    model the node is fetching already waits for the queue only.

    Score: ``least_loaded - load_s / seconds_per_node``. A second of load
    time weighs as much as the node's whole free fraction (the default
    ``seconds_per_node`` 1.0): a 250 MB model (2 s over 1 Gbit/s, 0.1 s
    from disk) sends the start to the node that holds it whenever it fits
    there, and a node whose fetch queue is long loses to one without; a
    model of a few MB (milliseconds) leaves the choice to load. Nodes
    without room are never scored (placement filters by fit first), so a
    full cached node never wins. Without a model (a plain name, or a
    ``Placing`` with no model) the score is ``least_loaded``'s exactly.
    Bandwidths in bytes per second; the defaults are this machine's
    measured tiers rounded down (docs/models.md) and a 1 Gbit/s link.
    """

    link_bps: float = 125e6
    disk_bps: float = 2e9
    memory_bps: float = 8e9
    seconds_per_node: float = 1.0

    def load_s(self, node: NodeInfo, model: str, size: int) -> float:
        """Estimated seconds until ``model`` (``size`` bytes) is readable on
        ``node`` and read once."""
        held = node.models.get(model) if node.models else None
        queue = node.fetching_bytes()
        if held is None:
            return (queue + size) / self.link_bps
        tier = held[0]
        if tier == "memory":
            return size / self.memory_bps
        if tier == FETCHING:
            # Already on its way: it waits for the queue (itself included),
            # not for a second copy.
            return queue / self.link_bps + size / self.disk_bps
        return size / self.disk_bps

    def __call__(self, node: NodeInfo, free: Res, need: Res, function: str | Placing = "") -> float:
        base = least_loaded(node, free, need, function)
        if not isinstance(function, Placing) or not function.model:
            return base
        size = function.model_bytes
        if size <= 0 and node.models:
            # Unknown size: a node that holds the model knows it.
            size = node.models.get(function.model, ("", 0))[1]
        return base - self.load_s(node, function.model, size) / self.seconds_per_node


#: The registered ``model_locality`` term, with the default bandwidths.
model_locality = ModelLocality()

SCORES: dict[str, Score] = {"least_loaded": least_loaded, "model_locality": model_locality}


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
