"""Dispatch policy: instance choice, request queueing and cold-start coalescing.

Pure: no I/O, an injected clock. The gRPC servicer and the simulator drive
the same object. A request either gets a slot at once (``acquire``) or waits
(``enqueue``); ``scale_ups_needed`` says how many instances to start so the
waiting requests are served, counting starts already under way, so a burst of
concurrent requests for a function with no instance shares one scale-up
(coalescing), and short requests queued behind a slow start count for the
slot time they need within a start's time (``startneed``). New instances,
releases and removals hand slots to waiters in arrival order and return who
got what; the caller wakes them.

Instance choice is indexed (a heap of the instances with a free slot), so a
request costs O(log n), not a scan of the function's n instances.
"""

from __future__ import annotations

import heapq
import itertools
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.runtime.clock import Clock

# (Defined there, imported from here by most callers.)
from functions.dispatch.slots import Grant as Grant
from functions.dispatch.slots import Instance as Instance
from functions.dispatch.slots import QueueFull as QueueFull
from functions.dispatch.slots import Waiter as Waiter
from functions.dispatch.startneed import StartPace

#: Request ids remembered per function for idempotent retries.
REQUEST_IDS_MAX = 10_000
#: How long a caller that asked to hold a lease (the gateway's slot cache)
#: may keep starting requests on it. Bounds how long a held slot is kept from
#: a waiter and how long a change of traffic split waits for old holds.
HOLD_S = 0.2


#: A lease: (instance_id, expires_at). A plain tuple (one per request): a named
#: one's ``tuple.__new__`` costs several times a display. (``Grant`` stays one.)
_Lease = tuple[str, float]


@dataclass
class FunctionRouter:
    """Routing state of one function on its owning Dispatch instance."""

    name: str
    concurrency: int
    max_scale: int
    clock: Clock
    lease_ttl_s: float = 300.0
    max_queue: int = 10_000
    lease_prefix: str = ""
    instances: dict[str, Instance] = field(default_factory=dict)
    waiters: deque[Waiter] = field(default_factory=deque)
    #: scale-ups started and not yet finished (ok or failed), and those
    #: written off (``add_instance``; not in ``pending``: added draining)
    pending: int = 0
    surplus_starts: int = 0
    leases: dict[str, _Lease] = field(default_factory=dict)
    last_active: float = 0.0
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    #: the unguessable part of each lease id (injected: tests fix it)
    lease_nonce: Callable[[], str] = field(default=lambda: secrets.token_hex(8), repr=False)
    #: the instances with a free slot as (in_flight, order, instance_id), a
    #: heap: its top is the least-loaded choice. An instance gets a new entry
    #: whenever its load changes while it has room; entries that no longer
    #: match their instance (busier, draining, removed) are dropped when they
    #: reach the top, or all at once when they pile up (``_reindex``).
    _free: list[tuple[int, int, str]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    #: the order in which each instance was added (``instances``' order)
    _order: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _added: itertools.count[int] = field(
        default_factory=itertools.count, init=False, repr=False, compare=False
    )
    #: totals over ``instances``, kept up to date with them (no scans):
    #: their ``free`` slots, and how many are draining
    _slots_free: int = field(default=0, init=False, repr=False, compare=False)
    _draining: int = field(default=0, init=False, repr=False, compare=False)
    #: requests in flight on ``instances`` (sum of ``in_flight``)
    _in_flight: int = field(default=0, init=False, repr=False, compare=False)
    #: request id -> the grant it got, while its lease lives (bounded): a
    #: retried request gets the same slot, not a second one
    _by_request: OrderedDict[str, Grant] = field(
        default_factory=OrderedDict, init=False, repr=False, compare=False
    )
    #: lease id -> its request id, so a release forgets the request at once:
    #: stale grants left for the bound kept a Grant per warm request alive
    #: (10,000 per function), walked by every full collection (2026-11-25, 95304db)
    _request_of: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: how long a held lease may take new requests (0: no holds), and when
    #: the last hold granted stops doing so; holds are closed while a
    #: routing change waits for them (a count: changes may overlap)
    hold_s: float = HOLD_S
    _holds_until: float = field(default=0.0, init=False, repr=False, compare=False)
    _holds_closed: int = field(default=0, init=False, repr=False, compare=False)
    #: request and start times, by which waiting requests count for starts
    #: (None: each counts as a whole slot, as the simulator's baselines do)
    pace: StartPace | None = None
    #: sum of the grant times of ``leases`` (expiry - lease_ttl_s), for
    #: how long the requests in flight have held their slots (``_busy_s``)
    _granted_sum: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # (set here, not only by their field defaults: a dataclass leaves an
        # init=False field with a plain default to the class attribute,
        # which the optional compiled build does not have)
        self._holds_until, self._holds_closed, self._granted_sum = 0.0, 0, 0.0
        for iid in self.instances:
            self._order[iid] = next(self._added)
        self._reindex()
        self._recount()

    # -- requests ---------------------------------------------------------

    def granted_for(self, request_id: str) -> Grant | None:
        """The grant an earlier request with this id got, if its lease is
        still held (idempotent Dispatch: a retry gets the same lease)."""
        if not request_id:
            return None
        g = self._by_request.get(request_id)
        if g is None:
            return None
        if g.lease_id not in self.leases:
            del self._by_request[request_id]  # released or expired: a new request
            return None
        return g

    def remember(self, request_id: str, grant: Grant) -> None:
        """Record the grant of a request id (the oldest are forgotten past
        ``REQUEST_IDS_MAX``)."""
        if not request_id:
            return
        self._by_request[request_id] = grant
        self._request_of[grant.lease_id] = request_id
        if len(self._by_request) > REQUEST_IDS_MAX:
            _, old = self._by_request.popitem(last=False)
            self._request_of.pop(old.lease_id, None)

    def _forget_request(self, lease_id: str) -> None:
        """The lease is gone: a retry of its request is a new request."""
        rid = self._request_of.pop(lease_id, None)
        if rid is not None:
            self._by_request.pop(rid, None)

    def acquire(self) -> Grant | None:
        """A slot on the least-loaded instance with room, if any (warm path).
        Waiters already queued go first: a new request never jumps the queue."""
        if self.waiters:
            return None
        inst = self._least_loaded()
        return None if inst is None else self._grant(inst, False)

    def acquire_on(self, instance_id: str) -> Grant | None:
        """A slot on that instance (the caller's choice: the LLM picker's) if
        it has one free and no waiter is queued, else None."""
        inst = self.instances.get(instance_id)
        if self.waiters or inst is None or inst.free <= 0:
            return None
        return self._grant(inst, False, top=False)

    def enqueue(self, token: Any = None) -> Waiter:
        """Queue a request that found no free slot."""
        if len(self.waiters) >= self.max_queue:
            raise QueueFull(
                f"function {self.name!r} has {len(self.waiters)} requests waiting "
                f"(limit {self.max_queue}); retry later"
            )
        w = Waiter(next(self._seq), self.clock.now(), token)
        self.waiters.append(w)
        return w

    def cancel(self, waiter: Waiter) -> bool:
        """Remove a waiter that gave up (deadline); False if it was served."""
        if waiter.done:
            return False
        waiter.done = True
        try:
            self.waiters.remove(waiter)
        except ValueError:
            pass
        return True

    def scale_ups_needed(self) -> int:
        """Instances to start now for the waiting requests (may be 0): each
        one running or starting absorbs up to ``concurrency`` of the slots
        they need (``demand``); only the remainder triggers starts, never
        beyond max_scale. A start that ends gives its share back."""
        if not self.waiters:
            return 0
        w = len(self.waiters)
        need = w if self.pace is None else self.pace.slots_for(w, self._busy_s())
        uncovered = need - self._slots_free - self.pending * self.concurrency
        if uncovered <= 0:
            return 0
        want = math.ceil(uncovered / self.concurrency)
        room = self.max_scale - self.live_count() - self.pending
        # max(0, min(want, room)) written out: runs per queued request (10x cheaper)
        n = room if room < want else want
        return n if n > 0 else 0

    def release(self, lease_id: str) -> tuple[bool, list[tuple[Waiter, Grant]]]:
        """Return a slot; hands it to the next waiter. (known, grants)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return False, []
        self._forget_request(lease_id)
        inst, now = self.instances.get(lease[0]), self.clock.now()  # its instance
        granted = lease[1] - self.lease_ttl_s
        self._granted_sum = self._granted_sum - granted if self.leases else 0.0
        if self.pace is not None and granted <= now < lease[1]:  # (expired: no request's time)
            self.pace.served(now - granted)
        if inst is not None and inst.in_flight > 0:
            inst.released_at = now
            n = inst.in_flight = inst.in_flight - 1
            self._in_flight -= 1
            if not inst.draining and n < inst.concurrency:
                self._slots_free += 1
                iid = inst.instance_id
                heapq.heappush(self._free, (n, self._order[iid], iid))
                if len(self._free) > 2 * len(self.instances) + 16:
                    self._reindex()
        self.last_active = now
        return True, self._serve_waiters(cold=False) if self.waiters else []

    def expire_leases(self) -> list[tuple[Waiter, Grant]]:
        """Release leases whose holder never called Release."""
        now = self.clock.now()
        grants: list[tuple[Waiter, Grant]] = []
        for lid in [lid for lid, (_, expires) in self.leases.items() if expires <= now]:
            grants.extend(self.release(lid)[1])
        return grants

    # -- holds (leases a caller keeps for its next requests) ---------------

    def hold(self) -> float:
        """Seconds the caller of the grant just made may keep starting
        requests on its lease (0: none). Only while no request waits (a held
        slot keeps no waiter more than ``hold_s``) and no routing change waits
        for holds to lapse (``close_holds``). A held lease counts as in flight
        (its holder releases it after a few idle ms: busy only that long)."""
        if self.hold_s <= 0 or self.waiters or self._holds_closed:
            return 0.0
        until = self.clock.now() + self.hold_s
        if until > self._holds_until:
            self._holds_until = until
        return self.hold_s

    def close_holds(self) -> float:
        """Grant no holds until ``open_holds``; returns the seconds until
        every hold granted so far stops taking new requests."""
        self._holds_closed += 1
        return self.holds_left()

    def holds_left(self) -> float:
        """Seconds until the last hold granted stops taking new requests."""
        left = self._holds_until - self.clock.now()
        return left if left > 0 else 0.0

    def open_holds(self) -> None:
        """Undo one ``close_holds``."""
        self._holds_closed = self._holds_closed - 1 if self._holds_closed > 0 else 0

    # -- instances --------------------------------------------------------

    def begin_scale_up(self, n: int = 1) -> None:
        """Record n instance starts under way."""
        self.pending += n
        if self.pace is not None:
            self.pace.began(self.clock.now(), n)

    def scale_up_done(self, inst: Instance) -> list[tuple[Waiter, Grant]]:
        """A started instance is ready: add it, serve waiters (cold starts)."""
        if self.pace is not None:
            self.pace.ended(self.clock.now(), ready=True)
        if self.surplus_starts > 0:
            self.surplus_starts -= 1
            inst.draining = True
        else:
            self.pending = self.pending - 1 if self.pending > 0 else 0
        return self.add_instance(inst, cold=True)

    def scale_up_failed(self) -> list[Waiter]:
        """A start failed. Returns the waiters that can no longer be served:
        all of them when nothing is running or starting to serve them later;
        the others may now need a replacement (``scale_ups_needed``)."""
        if self.pace is not None:
            self.pace.ended(self.clock.now(), ready=False)
        if self.surplus_starts > 0:
            self.surplus_starts -= 1  # written off: no waiter counted on it
        else:
            self.pending = max(0, self.pending - 1)
        return self._drain_waiters() if self.pending == self.live_count() == 0 else []

    def add_instance(
        self, inst: Instance, cold: bool = False, leases: list[str] | None = None
    ) -> list[tuple[Waiter, Grant]]:
        """Add an instance (idempotent by id), count the slots its previous
        owner leased out (``leases``: a handover), then give waiters the free
        ones. max_scale bounds ``live_count() + pending``: with no room, an
        instance handed over or recovered replaces a start under way (written
        off: ``surplus_starts``, added draining); else it is added draining
        (serving only its leases, retired once idle)."""
        known = self.instances.get(inst.instance_id)
        if known is None:
            if not inst.draining and self.live_count() + self.pending >= self.max_scale:
                if not cold and self.pending > 0:
                    self.pending -= 1
                    self.surplus_starts += 1
                else:
                    inst.draining = True
            inst.added_at = self.clock.now()
            self.instances[inst.instance_id] = inst
            self._order[inst.instance_id] = next(self._added)
            self._slots_free += inst.free
            self._draining += inst.draining
            self._in_flight += inst.in_flight
            self._index(inst)
        else:
            inst = known
        if leases:
            expires, free = self.clock.now() + self.lease_ttl_s, inst.free
            for lid in leases:
                if lid not in self.leases:
                    self.leases[lid] = (inst.instance_id, expires)
                    self._granted_sum += expires - self.lease_ttl_s
                    inst.in_flight += 1
                    self._in_flight += 1
            self._slots_free += inst.free - free
            self._index(inst)
        return self._serve_waiters(cold=cold)

    def remove_instance(self, instance_id: str) -> Instance | None:
        """Stop routing to an instance; its leases are dropped."""
        inst = self.instances.pop(instance_id, None)
        self._order.pop(instance_id, None)  # its heap entries are now stale
        if inst is not None:
            self._slots_free -= inst.free
            self._draining -= inst.draining
            self._in_flight -= inst.in_flight
            for lid in [lid for lid, (iid, _) in self.leases.items() if iid == instance_id]:
                self._granted_sum -= self.leases.pop(lid)[1] - self.lease_ttl_s
                self._forget_request(lid)
            if not self.leases:
                self._granted_sum = 0.0
        return inst

    def drain(self, instance_id: str) -> bool:
        """Take no new requests on the instance (before it is removed)."""
        inst = self.instances.get(instance_id)
        if inst is None:
            return False
        if not inst.draining:
            self._slots_free -= inst.free
            self._draining += 1
            inst.draining = True  # its heap entries are now stale
        return True

    def fail_all(self) -> list[Waiter]:
        """Remove and return every waiter (function deleted)."""
        return self._drain_waiters()

    def load(self) -> int:
        """Requests in flight on the instances plus those queued: the
        concurrency an autoscaler observes."""
        return self._in_flight + len(self.waiters)

    def demand(self) -> int:
        """``load`` with the waiting requests counted as the slots they need
        within a start's time (``startneed``): what the autoscaler scales on."""
        w = len(self.waiters)
        return self._in_flight + (
            w if self.pace is None else self.pace.slots_for(w, self._busy_s())
        )

    def _busy_s(self) -> float:
        """How long the requests in flight have held their slots, on average
        (0 with none): a lower bound on their service time."""
        n = len(self.leases)
        return self.clock.now() - self._granted_sum / n if n else 0.0

    def live_count(self) -> int:
        """Instances that count toward max_scale (draining ones do not)."""
        return len(self.instances) - self._draining

    def update_spec(self, concurrency: int, max_scale: int) -> list[tuple[Waiter, Grant]]:
        """Apply a new spec version; new concurrency applies to new instances
        and to existing ones (a higher limit frees slots at once)."""
        self.concurrency, self.max_scale = concurrency, max_scale
        for inst in self.instances.values():
            inst.concurrency = concurrency
        self._reindex()
        self._recount()
        return self._serve_waiters(cold=False)

    # -- internals --------------------------------------------------------

    def _least_loaded(self) -> Instance | None:
        """The instance with a free slot and the fewest requests in flight;
        ties go to the oldest instance (added first), which packs load so
        idle newer instances can scale to zero. It is the top of ``_free``
        once stale entries are dropped, and stays there for ``_grant``."""
        heap, instances, order = self._free, self.instances, self._order
        while heap:
            n, k, iid = heap[0]
            inst = instances.get(iid)
            if (
                inst is not None
                and inst.in_flight == n
                and order.get(iid) == k
                and not inst.draining
                and n < inst.concurrency
            ):
                return inst
            heapq.heappop(heap)
        return None

    def _index(self, inst: Instance) -> None:
        """Enter a routable instance in ``_free`` under its current load when
        it has a free slot (call after any change that may free one)."""
        if not inst.draining and inst.in_flight < inst.concurrency:
            iid = inst.instance_id
            heapq.heappush(self._free, (inst.in_flight, self._order[iid], iid))
            # Stale entries of removed instances may never reach the top
            # (``release`` has a copy of this, inline: it runs per request).
            if len(self._free) > 2 * len(self.instances) + 16:
                self._reindex()

    def _reindex(self) -> None:
        """Rebuild ``_free`` from the instances (drops every stale entry)."""
        order = self._order
        self._free = [
            (i.in_flight, order[iid], iid)
            for iid, i in self.instances.items()
            if not i.draining and i.in_flight < i.concurrency
        ]
        heapq.heapify(self._free)

    def _recount(self) -> None:
        """Recompute the totals from the instances."""
        self._slots_free = sum(i.free for i in self.instances.values())
        self._draining = sum(1 for i in self.instances.values() if i.draining)
        self._in_flight = sum(i.in_flight for i in self.instances.values())

    def _grant(self, inst: Instance, cold: bool, top: bool = True) -> Grant:
        """A slot on inst, which ``_least_loaded`` just chose (``top``: the
        heap top, whose entry moves to its new load, or out when it is now
        full) or the caller did (its entry is stale now: a new one goes in)."""
        n = inst.in_flight = inst.in_flight + 1
        self._in_flight += 1
        self._slots_free -= 1  # it had one (at least): not draining, below its limit
        if not top:
            self._index(inst)
        elif n < inst.concurrency:
            heapq.heapreplace(self._free, (n, self._order[inst.instance_id], inst.instance_id))
        else:
            heapq.heappop(self._free)
        now = self.clock.now()
        self.last_active = now
        # The random part makes a lease id a capability: Release needs no
        # other proof, and no one can release a slot they were not given.
        lease_id = f"{self.lease_prefix}{self.name}/{next(self._seq)}.{self.lease_nonce()}"
        self.leases[lease_id] = (inst.instance_id, now + self.lease_ttl_s)
        self._granted_sum += now
        # tuple.__new__ makes the same named tuple as Grant(...), without its
        # generated Python __new__ (one per request).
        return tuple.__new__(Grant, (lease_id, inst, cold))

    def _serve_waiters(self, cold: bool) -> list[tuple[Waiter, Grant]]:
        out: list[tuple[Waiter, Grant]] = []
        while self.waiters:
            inst = self._least_loaded()
            if inst is None:
                break
            w = self.waiters.popleft()
            w.done = True
            # A waiter served by an instance added within this call waited
            # for a cold start; one served by a release did not.
            out.append((w, self._grant(inst, cold=cold)))
        return out

    def _drain_waiters(self) -> list[Waiter]:
        out = list(self.waiters)
        self.waiters.clear()
        for w in out:
            w.done = True
        return out
