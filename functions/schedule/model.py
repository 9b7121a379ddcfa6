"""Data of the Schedule placement policy: node views, placement steps, scores.

Pure data, no I/O; see ``functions.schedule.policy`` for how they are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.runtime.resources import Res, interned
from controlplane.runtime.scoring import NodeInfo, Placing, Score, least_loaded

ZERO = Res()

__all__ = ["NodeInfo", "Placing", "Score", "least_loaded"]  # also used from here


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
    """Step: no node in the partition fits; ``reason`` is for the caller.

    permanent: no node of the partition could hold it even empty (the spec
    asks for more than any node has), so waiting or retrying will not help.
    """

    reason: str
    permanent: bool = False


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
    #: The function being placed (scoring terms may use it: locality).
    function: str | Placing = ""


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
    # Exact partitions (``PlacementPolicy(exact=True)``): the status's
    # allocation less what was still starting (counted by the policy as its
    # reservations in flight), the confirmed placements no status has
    # counted yet as (node seq when ready, need), their sum, and whether
    # the view is in doubt (a node agent refused a reservation, a probe
    # failed): such a node is probed before it is used again.
    settled: Res = ZERO
    unsettled: list[tuple[int, Res]] = field(default_factory=list)
    unsettled_sum: Res = ZERO
    uncertain: bool = False

    # The free estimates are on the placement hot path: they work component
    # by component, in the order of the Res arithmetic they stand for (given
    # in each docstring), and make one Res at most. ``x if x > 0 else 0`` is
    # max(x, 0) for these ints, at a tenth of the cost of the builtin call.

    def _status_left(self) -> tuple[int, int, int]:
        """capacity - allocated - (confirmed - status_confirmed) - inflight"""
        cap, al = self.info.capacity, self.info.allocated
        co, sc, inf = self.confirmed, self.status_confirmed, self.inflight
        return (
            cap.cpu_millis - al.cpu_millis - (co.cpu_millis - sc.cpu_millis) - inf.cpu_millis,
            cap.memory_mib - al.memory_mib - (co.memory_mib - sc.memory_mib) - inf.memory_mib,
            cap.gpus - al.gpus - (co.gpus - sc.gpus) - inf.gpus,
        )

    def status_free(self) -> Res:
        """(capacity - allocated - since - inflight).clamped(), where since
        is ``confirmed - status_confirmed``: what the status misses."""
        c, m, g = self._status_left()
        return Res(c if c > 0 else 0, m if m > 0 else 0, g if g > 0 else 0)

    def status_fits(self, need: Res) -> bool:
        """need.fits_in(self.status_free())"""
        c, m, g = self._status_left()
        return (
            need.cpu_millis <= (c if c > 0 else 0)
            and need.memory_mib <= (m if m > 0 else 0)
            and need.gpus <= (g if g > 0 else 0)
        )

    def _exact_left(self) -> tuple[int, int, int]:
        """capacity - settled - unsettled_sum - inflight"""
        cap, se, un, inf = self.info.capacity, self.settled, self.unsettled_sum, self.inflight
        return (
            cap.cpu_millis - se.cpu_millis - un.cpu_millis - inf.cpu_millis,
            cap.memory_mib - se.memory_mib - un.memory_mib - inf.memory_mib,
            cap.gpus - se.gpus - un.gpus - inf.gpus,
        )

    def exact_free(self) -> Res:
        """What is free if this policy is the node's only allocator: the
        last status's settled allocation, plus the placements confirmed
        since that it does not count, plus the reservations in flight."""
        c, m, g = self._exact_left()
        return interned(c if c > 0 else 0, m if m > 0 else 0, g if g > 0 else 0)

    def exact_fits(self, need: Res) -> bool:
        """need.fits_in(self.exact_free())"""
        c, m, g = self._exact_left()
        return need.cpu_millis <= c and need.memory_mib <= m and need.gpus <= g

    def settle(self, info: NodeInfo) -> None:
        """Take a newer status into the exact view: confirmed placements it
        counts (ready at or before its seq) leave ``unsettled``."""
        self.settled = info.allocated - info.starting
        if self.unsettled:
            keep = [(s, r) for s, r in self.unsettled if s > info.seq]
            if len(keep) != len(self.unsettled):
                self.unsettled = keep
                total = ZERO
                for _, r in keep:
                    total = total + r
                self.unsettled_sum = total

    def cached_free(self) -> Res:
        """(probe_free - inflight).clamped()"""
        pf, inf = self.probe_free, self.inflight
        assert pf is not None
        c = pf.cpu_millis - inf.cpu_millis
        m = pf.memory_mib - inf.memory_mib
        g = pf.gpus - inf.gpus
        return interned(c if c > 0 else 0, m if m > 0 else 0, g if g > 0 else 0)

    def cached_fits(self, need: Res) -> bool:
        """need.fits_in(self.cached_free())"""
        pf, inf = self.probe_free, self.inflight
        assert pf is not None
        c = pf.cpu_millis - inf.cpu_millis
        m = pf.memory_mib - inf.memory_mib
        g = pf.gpus - inf.gpus
        return (
            need.cpu_millis <= (c if c > 0 else 0)
            and need.memory_mib <= (m if m > 0 else 0)
            and need.gpus <= (g if g > 0 else 0)
        )


def describe(need: Res) -> str:
    """``cpu=500m mem=256MiB gpu=0`` for messages."""
    return f"cpu={need.cpu_millis}m mem={need.memory_mib}MiB gpu={need.gpus}"
