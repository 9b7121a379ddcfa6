"""Capacity credits, the grant side: a Schedule instance delegates small
slices of its partition's free capacity to Dispatch instances. Pure: no I/O.

Two-level scheduling as in Mesos's resource offers (Hindman et al., NSDI
2011) and Omega's optimistic shared state (Schwarzkopf et al., EuroSys
2013): the Schedule instance stays the only allocator of its partition, and
lends a Dispatch instance the right to allocate a bounded slice of one node
itself (a *credit*). Dispatch then creates an instance on that node directly
(the node agent still checks its own capacity), skipping the Schedule hop.

A credit is a reservation of the production ``PlacementPolicy``: the policy
chooses its node as for any placement (power of d, its exact view) and holds
the slice in flight, so every placement sees it as allocated. Then:

- a **use** reported by the holder (the need and the node's seq when the
  instance became ready) becomes a confirmed placement of that size, exactly
  as a Schedule placement's confirm; the rest of the slice stays held;
- a **return** releases what is left; a return marked *refused* (the agent
  said it was full) also puts the node in doubt (``PlacementPolicy.reject``);
- a credit **expires** ``grace_s`` after the holder's own expiry (which the
  holder reads from ``ttl_s`` on its clock), so a use the holder made just
  before its expiry is still reported to a live hold;
- a node that leaves the partition (membership change) or dies takes its
  credits with it (``retain``).

The ledger bounds what each holder may hold (``max_per_holder`` slices).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.credits import Grant, Use
from controlplane.runtime.resources import Res
from functions.schedule.model import Placement, Reservation
from functions.schedule.policy import PlacementPolicy

__all__ = ["CreditLedger", "Grant", "Use"]


@dataclass
class _Credit:
    holder: str
    hold: Reservation  # the slice still held (its need shrinks with uses)
    expires_at: float  # the holder's expiry + grace, on this clock
    granted: Res = field(default_factory=Res)


class CreditLedger:
    """The credits one Schedule instance has granted (see the module docstring).

    slice: resources of one credit. ttl_s: how long a holder may use it.
    grace_s: how long after that the hold is kept for late use reports.
    max_per_holder: credits one holder may hold at once.
    """

    def __init__(
        self,
        policy: PlacementPolicy,
        *,
        slice: Res,
        ttl_s: float,
        grace_s: float = 2.0,
        max_per_holder: int = 4,
        clock: Clock | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if max_per_holder < 0:
            raise ValueError("max_per_holder must be >= 0")
        self.policy = policy
        self.slice = slice
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        self.max_per_holder = max_per_holder
        self.clock = clock or MonotonicClock()
        self._credits: dict[str, _Credit] = {}
        self._serial = itertools.count(1)
        #: counters: granted, used, returned, refused, expired, dropped
        self.stats: dict[str, int] = dict.fromkeys(
            ("granted", "used", "returned", "refused", "expired", "dropped"), 0
        )

    def __len__(self) -> int:
        return len(self._credits)

    def held_by(self, holder: str) -> int:
        """Credits ``holder`` holds now."""
        return sum(1 for c in self._credits.values() if c.holder == holder)

    def holders(self) -> set[str]:
        """The holders of credits now."""
        return {c.holder for c in self._credits.values()}

    def delegated(self) -> Res:
        """What is lent out now (the slices' unused parts)."""
        total = Res()
        for c in self._credits.values():
            total = total + c.hold.need
        return total

    # ----- the holder's calls -------------------------------------------------

    def sync(
        self,
        holder: str,
        used: list[Use] = [],  # noqa: B006 - read only
        returned: list[tuple[str, bool]] = [],  # noqa: B006 - read only
        want: int = 0,
    ) -> list[Grant]:
        """One exchange with a holder: take its use reports, then its returns
        ((credit id, refused) pairs), then grant up to ``want`` new credits
        within its bound. Reports of unknown credits (expired, dropped, or
        another holder's) are ignored: the node's status counts such an
        instance once it is ready."""
        self.expire()
        for u in used:
            self._use(holder, u)
        for cid, refused in returned:
            self._return(holder, cid, refused)
        return self._grant(holder, want)

    def _use(self, holder: str, u: Use) -> None:
        c = self._credits.get(u.credit_id)
        if c is None or c.holder != holder:
            return
        hold = c.hold
        # The used part becomes a confirmed placement of its own; the hold
        # keeps the rest. (Over-use cannot happen unnoticed: the agent
        # refuses what does not fit; a report larger than the hold confirms
        # what is left.)
        part = u.need if u.need.fits_in(hold.need) else hold.need
        self.policy.confirm(_split(hold, part), u.node_seq)
        self.stats["used"] += 1

    def _return(self, holder: str, cid: str, refused: bool) -> None:
        c = self._credits.get(cid)
        if c is None or c.holder != holder:
            return
        del self._credits[cid]
        if refused:  # someone else allocated there: the view is in doubt
            self.policy.reject(c.hold)
            self.stats["refused"] += 1
        else:
            self.policy.abort(c.hold)
            self.stats["returned"] += 1

    def _grant(self, holder: str, want: int) -> list[Grant]:
        room = self.max_per_holder - self.held_by(holder)
        n = min(want, room)
        if n <= 0:
            return []
        # A holder's credits go to distinct nodes, so a burst it serves
        # from them spreads over as many sandbox creators.
        mine = {c.hold.node_id for c in self._credits.values() if c.holder == holder}
        now = self.clock.now()
        out: list[Grant] = []
        for _ in range(n):
            # Packing: a credit goes only to a node that keeps another slice
            # free beside it (Schedule's own placements still find room), and
            # is at most a quarter of its node.
            pl = self.policy.begin(self.slice + self.slice)
            pl.excluded.update(mine)
            step = self.policy.advance(pl)
            if not isinstance(step, Reservation) or not _small_enough(self.slice, step):
                # A node in doubt (to probe), no room for two slices, or
                # nodes too small for credits: grant no more; the holder
                # places through Schedule.
                self.policy.cancel(pl)
                break
            self.policy.abort(_split(step, self.slice))  # hold one slice
            cid = f"{self.policy.schedule_id}/{next(self._serial)}"
            self._credits[cid] = _Credit(holder, step, now + self.ttl_s + self.grace_s, step.need)
            mine.add(step.node_id)
            out.append(Grant(cid, step.node_id, step.address, step.need, self.ttl_s))
            self.stats["granted"] += 1
        return out

    # ----- upkeep ---------------------------------------------------------------

    def expire(self) -> int:
        """Release the holds of credits past their expiry; returns how many."""
        now = self.clock.now()
        gone = [cid for cid, c in self._credits.items() if c.expires_at <= now]
        for cid in gone:
            self.policy.abort(self._credits.pop(cid).hold)
        self.stats["expired"] += len(gone)
        return len(gone)

    def retain(self) -> list[str]:
        """Drop the credits on nodes no longer in the policy's partition
        (moved away by a membership change, or dead); returns their ids.
        Their holders find out when they next sync or when the agent (or a
        new owner) refuses."""
        gone = [cid for cid, c in self._credits.items() if c.hold.node_id not in self.policy]
        for cid in gone:
            self.policy.abort(self._credits.pop(cid).hold)
        self.stats["dropped"] += len(gone)
        return gone

    def drop_holder(self, holder: str) -> int:
        """Release every credit of a holder (it left the membership)."""
        gone = [cid for cid, c in self._credits.items() if c.holder == holder]
        for cid in gone:
            self.policy.abort(self._credits.pop(cid).hold)
        self.stats["dropped"] += len(gone)
        return len(gone)


def _split(hold: Reservation, part: Res) -> Reservation:
    """Cut ``part`` off a held reservation: a new held reservation of that
    size on the same node (the policy counts both in flight, as the one
    before), to be confirmed or aborted on its own."""
    hold.need = (hold.need - part).clamped()
    return Reservation(0, hold.node_id, hold.address, part, Placement(part, 0.0), hold.node)


def _small_enough(slice: Res, r: Reservation) -> bool:
    """At most a quarter of the node's capacity (in every resource it has)."""
    cap = r.node.info.capacity
    return 4 * slice.cpu_millis <= cap.cpu_millis and 4 * slice.memory_mib <= cap.memory_mib
