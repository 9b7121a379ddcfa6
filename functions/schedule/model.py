"""Data of the Schedule placement policy: node views, placement steps, scores.

Pure data, no I/O; see ``functions.schedule.policy`` for how they are used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.nodeagent.capacity import Res

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


@dataclass(frozen=True)
class Target:
    """A node to probe: its id and the address of its node agent."""

    node_id: str
    address: str


@dataclass(frozen=True)
class ProbeNodes:
    """Step: probe these nodes, then feed each answer to ``record_probe``."""

    targets: tuple[Target, ...]


@dataclass(frozen=True)
class NoFit:
    """Step: no node in the partition fits; ``reason`` is for the caller."""

    reason: str


@dataclass
class Placement:
    """One placement in progress (create with ``PlacementPolicy.begin``)."""

    need: Res
    started_at: float
    #: Rounds of candidate selection so far (bounded by ``max_attempts``).
    attempts: int = 0
    #: Probes this placement asked for.
    probes: int = 0
    excluded: set[str] = field(default_factory=set)
    candidates: list[str] = field(default_factory=list)
    #: Candidates whose free capacity is known for this round (probed or fresh).
    known: set[str] = field(default_factory=set)
    #: node_id -> (tick, send time, node record, its confirmed total at send).
    awaiting: dict[str, tuple[int, float, NodeState, Res]] = field(default_factory=dict)
    reservation: Reservation | None = None
    done: bool = False


@dataclass
class Reservation:
    """Step: capacity held on a node; create the instance there, then call
    ``confirm``, ``reject`` (agent said RESOURCE_EXHAUSTED) or ``abort``."""

    id: int
    node_id: str
    address: str
    need: Res
    placement: Placement
    node: NodeState = field(repr=False)
    #: "held", "confirmed", "rejected" or "aborted".
    state: str = "held"


@dataclass
class Stats:
    """Counters of the policy since it was made."""

    placements: int = 0
    probes: int = 0
    #: Placements decided without any probe (all candidates cached).
    cache_hits: int = 0
    rejections: int = 0
    probe_failures: int = 0
    no_fit: int = 0


@dataclass(eq=False)
class NodeState:
    """What a policy keeps per node (internal to the policy; compared by identity)."""

    info: NodeInfo
    # Cumulative sum of confirmed placements; never decreases, so the
    # placements made since any snapshot are an exact difference.
    confirmed: Res = ZERO
    status_confirmed: Res = ZERO  # ``confirmed`` when the status arrived
    inflight: Res = ZERO
    probe_free: Res | None = None
    probe_at: float = 0.0
    probe_tick: int = -1

    def status_free(self) -> Res:
        since = self.confirmed - self.status_confirmed
        return (self.info.capacity - self.info.allocated - since - self.inflight).clamped()

    def cached_free(self) -> Res:
        assert self.probe_free is not None
        return (self.probe_free - self.inflight).clamped()


#: Scores a candidate: (node, free estimate, need) -> higher is better.
Score = Callable[[NodeInfo, Res, Res], float]


def least_loaded(node: NodeInfo, free: Res, need: Res) -> float:
    """Default score: the free fraction left on the node's tightest resource
    after placing ``need`` (spreads load; ties go to the first sampled)."""
    cap, left = node.capacity, free - need
    fractions = [
        left_v / cap_v
        for left_v, cap_v in (
            (left.cpu_millis, cap.cpu_millis),
            (left.memory_mib, cap.memory_mib),
            (left.gpus, cap.gpus),
        )
        if cap_v > 0
    ]
    return min(fractions, default=0.0)


def describe(need: Res) -> str:
    """``cpu=500m mem=256MiB gpu=0`` for messages."""
    return f"cpu={need.cpu_millis}m mem={need.memory_mib}MiB gpu={need.gpus}"
