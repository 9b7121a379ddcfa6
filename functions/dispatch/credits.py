"""Capacity credits, the use side: what one Dispatch instance holds. Pure: no I/O.

A Schedule instance lends a Dispatch instance small slices of nodes' free
capacity (``functions.schedule.credits``; after Mesos's resource offers and
Omega's optimistic shared state). With a credit that fits, a scale-up asks
the node agent directly (CreateInstance) and skips the Dispatch -> Schedule
hop; the agent still checks its own capacity, and a refusal falls back to
Schedule. The wallet decides; the caller (the servicer's ``Peers``, or the
simulator) performs the calls:

    use = wallet.take(need)                   # None: place through Schedule
    ... CreateInstance on use.node_id at use.address ...
    wallet.settled(use, node_seq)             # created (or refused / failed)
    for grantor in wallet.due(home, upkeep=False):  # the refill, off the critical path
        req = wallet.begin_sync(grantor)      # reports, returns, want
        grants = <GrantCredits RPC>(req)
        wallet.end_sync(req, grants)          # (None if the call failed)

Refills are asked right after a credit is used (and after a miss), never
awaited by a scale-up; credits near their expiry and credits of an idle
holder go back; a membership change drops credits whose grantor no longer
owns their node. How many credits are held follows demand
(``functions.dispatch.credit_demand``): a floor while starts are rare, up
to ``target`` at once when a start found none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.credits import Grant, Use
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import NodeInfo, Score, least_loaded
from functions.dispatch.credit_demand import CreditDemand


@dataclass
class Credit:
    """A credit held: what is left of its slice, until ``expires_at``."""

    grantor: str  # the Schedule instance's id
    credit_id: str
    node_id: str
    address: str
    left: Res
    expires_at: float
    last_used: float
    #: instances being created from it (a return waits for them)
    creating: int = 0
    #: no further use: goes back to the grantor once nothing is creating
    retired: bool = False
    refused: bool = False
    #: the slice as granted (what ``left`` started from)
    granted: Res = field(default_factory=Res)
    #: goes back with the next upkeep (refused, failed, or an idle holder's),
    #: not only with the next exchange with its grantor
    prompt: bool = False


@dataclass(frozen=True)
class CreditUse:
    """One scale-up served from a credit: create the instance there."""

    credit: Credit
    need: Res

    @property
    def node_id(self) -> str:
        """The node to create the instance on."""
        return self.credit.node_id

    @property
    def address(self) -> str:
        """Its node agent's address."""
        return self.credit.address


@dataclass
class SyncRequest:
    """One GrantCredits exchange with a grantor."""

    grantor: str
    used: list[Use] = field(default_factory=list)
    returned: list[tuple[str, bool]] = field(default_factory=list)
    want: int = 0


class CreditWallet:
    """The credits of one Dispatch instance (see the module docstring).

    target: credits to hold at most (the bound on what this instance holds);
    floor: credits held while scale-ups happen at all; how many between the
    two follows demand (``CreditDemand``: up at once when a start found no
    credit, down one per ``shrink_s`` without). renew_s: a credit this close
    to its expiry is not used and goes back (the next sync asks for a fresh
    one); the periodic upkeep (``due`` with ``upkeep``) replaces credits
    already within twice that, so with an upkeep period <= renew_s a busy
    holder never finds all of its credits expired at once. idle_s: with no scale-up for this long,
    credits go back and none are asked for. max_starting: instances being
    created from one credit at once (0: no bound); a burst beyond that goes
    to other credits or to Schedule, so it does not queue behind one node's
    sandbox starts. room_retries: see ``room_retry``.
    """

    def __init__(
        self,
        *,
        target: int = 4,
        floor: int = 2,
        shrink_s: float = 10.0,
        renew_s: float = 1.0,
        idle_s: float = 60.0,
        max_starting: int = 0,
        room_retries: int = 3,
        score: Score = least_loaded,
        clock: Clock | None = None,
    ) -> None:
        if target < 0:
            raise ValueError("target must be >= 0")
        if max_starting < 0:
            raise ValueError("max_starting must be >= 0")
        if room_retries < 0:
            raise ValueError("room_retries must be >= 0")
        self.target = target
        self.clock = clock or MonotonicClock()
        #: how many credits to ask for (within [floor, target])
        self.demand = CreditDemand(floor=floor, ceiling=target, shrink_s=shrink_s, clock=self.clock)
        #: ranks the nodes this wallet holds credit on (Schedule's terms)
        self.score = score
        self.max_starting = max_starting
        self.renew_s = renew_s
        self.idle_s = idle_s
        self._credits: dict[str, Credit] = {}
        self._used: dict[str, list[Use]] = {}
        self._returns: dict[str, list[tuple[str, bool]]] = {}
        #: grantor -> when its pending returns are due by themselves
        self._return_by: dict[str, float] = {}
        #: grantors with an exchange in flight, and credits asked in them
        self._syncing: dict[str, int] = {}
        #: grantors with returns in the exchange in flight
        self._returning: set[str] = set()
        self.room_retries = room_retries
        self._last_scale_up = float("-inf")
        #: where new credits are asked when the caller names no one
        self.home = ""
        #: counters: hits, misses, refused, failed, granted, returned, dropped
        self.stats: dict[str, int] = dict.fromkeys(
            ("hits", "misses", "refused", "failed", "granted", "returned", "dropped"), 0
        )

    def credits(self) -> list[Credit]:
        """The credits held now (retired ones included until returned)."""
        return list(self._credits.values())

    # ----- the scale-up path ------------------------------------------------------

    def take(self, need: Res, function: str = "") -> CreditUse | None:
        """A credit that fits ``need``, with ``need`` taken from it; None on
        a miss. Among those that fit: the fewest starts in flight (spreads a
        burst over nodes), then the best node by the scoring term
        (``score``, the registry Schedule places with: a credit only says
        where capacity is reserved for this holder, the term picks among
        those nodes as Schedule would among its own). Either way, a refill
        becomes due."""
        now = self.clock.now()
        self._last_scale_up = now
        self._retire_old(now, self.renew_s)
        best: Credit | None = None
        best_score = 0.0
        for c in list(self._credits.values()):
            if c.retired:
                continue
            if not need.fits_in(c.left):
                # Spent (for starts of this size): back it goes, and the
                # refill asks for a whole slice instead.
                c.retired = True
                self._finish(c)
            elif self.max_starting and c.creating >= self.max_starting:
                continue  # its node has enough starts queued from here
            elif best is None or c.creating <= best.creating:
                s = self._score(c, need, function)
                if best is None or c.creating < best.creating or s > best_score:
                    best, best_score = c, s
        if best is None:
            self.stats["misses"] += 1
            self.demand.took(hit=False, room_left=False)  # before the refill asks
            return None
        best.left = best.left - need
        best.creating += 1
        best.last_used = now
        if not need.fits_in(best.left):
            best.retired = True  # spent: returned once its start is settled
        self.stats["hits"] += 1
        # Another start like this one could go at once: to a credit with
        # room and no start in flight (a burst spreads over as many
        # sandbox creators as credits held).
        spare = any(
            not c.retired and c.creating == 0 and need.fits_in(c.left)
            for c in self._credits.values()
        )
        self.demand.took(hit=True, room_left=spare)
        return CreditUse(best, need)

    def _score(self, c: Credit, need: Res, function: str) -> float:
        # The node as this holder sees it: its credit's slice is the
        # capacity, what is left of it the free estimate.
        size = c.granted if c.granted != Res() else c.left
        node = NodeInfo(c.node_id, c.address, size, size - c.left)
        return self.score(node, c.left, need, function)

    def settled(self, use: CreditUse, node_seq: int | None, refused: bool = False) -> None:
        """The CreateInstance of ``use`` finished: created (``node_seq`` is
        the node's seq when ready), refused by the agent (``refused``: it is
        full; the credit goes back marked so), or failed otherwise
        (``node_seq`` None: the credit goes back, its node may be down)."""
        c = use.credit
        c.creating -= 1
        if node_seq is not None and not refused:
            self._used.setdefault(c.grantor, []).append(Use(c.credit_id, use.need, node_seq))
        else:
            self.stats["refused" if refused else "failed"] += 1
            c.retired = True
            c.refused = c.refused or refused
            # The grantor hears of it soon: a refusal puts its view of the
            # node in doubt, a failure may mean the node is down.
            c.prompt = True
        self._finish(c)

    # ----- exchanges with grantors --------------------------------------------------

    def due(self, home: str = "", *, upkeep: bool = True) -> list[str]:
        """Grantors to sync with now (none with an exchange in flight):
        ``home`` (where new credits are asked; default: the last one named)
        when more are wanted, and with ``upkeep`` (the periodic call) those
        with returns due. Use reports go with the next exchange with their
        grantor, at the latest with the credit's return: until then the
        hold still counts the instance (an over-estimate of what is used,
        never an under-estimate), so they need not cost a message. Returns
        go with the next exchange with their grantor too; one is due by
        itself only when the credit would have gone back unspent (within
        ``2 * renew_s`` of its expiry: its remainder is held no longer than
        an unused slice is), or at once when refused, failed or idle (and
        after ``return_all``). A spent credit so costs no exchange of its
        own: its return rides the refill that replaces the next one."""
        home = self.home = home or self.home
        now = self.clock.now()
        self._retire_old(now, 2 * self.renew_s if upkeep else self.renew_s)
        out = []
        if upkeep:
            out = sorted(
                g for g, by in self._return_by.items() if by <= now and g not in self._syncing
            )
        if home and home not in self._syncing and home not in out and self._want() > 0:
            out.append(home)
        return out

    def begin_sync(self, grantor: str) -> SyncRequest:
        """The request for one exchange (reports and returns leave the
        wallet; new credits are asked when ``grantor`` is ``home``)."""
        req = SyncRequest(grantor, self._used.pop(grantor, []), self._returns.pop(grantor, []), 0)
        self._return_by.pop(grantor, None)
        if req.returned:
            self._returning.add(grantor)
        if grantor == self.home:
            req.want = self._want()
        self._syncing[grantor] = req.want
        return req

    def end_sync(self, req: SyncRequest, grants: list[Grant] | None) -> None:
        """The exchange's answer (None: the call failed -- the grantor may be
        gone, and with it the holds of its credits: drop them)."""
        self._syncing.pop(req.grantor, None)
        self._returning.discard(req.grantor)
        if grants is None:
            self.drop(lambda c: c.grantor != req.grantor)
            return
        now = self.clock.now()
        for g in grants:
            self._credits[g.credit_id] = Credit(
                req.grantor, g.credit_id, g.node_id, g.address, g.resources,
                now + g.ttl_s, now, granted=g.resources,
            )  # fmt: skip
        self.stats["granted"] += len(grants)

    def return_all(self) -> None:
        """Make every pending return due now (the room they hold is wanted:
        ``room_retry``); the next ``due(upkeep=True)`` names their grantors."""
        self._return_by = dict.fromkeys(self._return_by, float("-inf"))

    def returns_pending(self) -> bool:
        """Credits retired and not yet in an exchange."""
        return any(self._returns.values())

    def returns_outstanding(self) -> bool:
        """Credits retired whose grantors do not have them back yet (queued,
        or in an exchange in flight): their holds still count on their
        nodes."""
        return bool(self._returning) or self.returns_pending()

    def room_retry(self, tries: int) -> bool:
        """A start Schedule refused for room: try it again once the
        remainders this wallet still holds are back with their grantors?
        (The caller returns them at once: ``return_all``, ``due(upkeep=True)``
        and the exchanges, until ``returns_outstanding`` is false.) Yes while some
        are outstanding, at most ``room_retries`` times per start: in a
        burst, slices granted and spent strand remainders too small for a
        start, and without this the start's waiters sit out the next
        autoscaler round while that room goes unused."""
        return tries < self.room_retries and self.returns_outstanding()

    def drop(self, keep: Callable[[Credit], bool]) -> int:
        """Forget credits for which ``keep`` is false (e.g. their grantor no
        longer owns their node after a membership change: the new owner does
        not know of them). Nothing is returned for them: their grantor
        dropped the hold already, or will at expiry."""
        gone = [cid for cid, c in self._credits.items() if not keep(c)]
        for cid in gone:
            c = self._credits.pop(cid)
            c.retired = True
        self.stats["dropped"] += len(gone)
        return len(gone)

    # ----- internals --------------------------------------------------------------

    def _want(self) -> int:
        if self.clock.now() - self._last_scale_up > self.idle_s:
            return 0  # idle: hold nothing
        live = sum(1 for c in self._credits.values() if not c.retired)
        return max(0, self.demand.target() - live - sum(self._syncing.values()))

    def _retire_old(self, now: float, ahead: float) -> None:
        """Retire credits within ``ahead`` of expiry, and all of an idle holder's."""
        idle = now - self._last_scale_up > self.idle_s
        for c in list(self._credits.values()):
            if not c.retired and (idle or c.expires_at - now <= ahead):
                c.retired = True
                c.prompt = c.prompt or idle
                self._finish(c)

    def _finish(self, c: Credit) -> None:
        if c.retired and c.creating == 0 and self._credits.pop(c.credit_id, None) is not None:
            g = c.grantor
            self._returns.setdefault(g, []).append((c.credit_id, c.refused))
            by = self.clock.now() if c.prompt else c.expires_at - 2 * self.renew_s
            self._return_by[g] = min(by, self._return_by.get(g, by))
            self.stats["returned"] += 1
