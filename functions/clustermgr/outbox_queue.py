"""The queueing decisions of ClusterMgr's outbox to one Schedule instance.
Pure: no I/O, time passed in.

One queue per Schedule address. The newest message per node replaces an
unsent older one (and goes to the end); an urgent message (a change) sends
the queue at once, a queue of refreshes only lingers up to ``linger_s`` for
company. A round sends what is queued in calls of up to ``batch`` messages
and goes on until the queue is empty: what arrives while a call is in
flight goes with the next call. A failed call's messages are retried (up to
``tries`` sends each, unless a newer one for the node was queued meanwhile)
after a backoff, after which refreshes alone may linger again.

The driver (``functions.clustermgr.outbox.Outbox`` with asyncio and gRPC;
``simulator.galaxy.modnodes`` on the simulated clock) performs the calls::

    t = q.put(node_id, msg, now=now, urgent=u)   # not None: wake at t (earlier)
    ...at the wake time t:
    r = q.poll(now)           # a batch to send now, a later wake time, or None (idle)
    ...send r as one call...
    t = q.sent(now)           # ok: next wake time (now: the round goes on), or None
    t, lost = q.failed(now)   # failed: wake after the backoff; lost: given up
"""

from __future__ import annotations

from itertools import islice
from typing import Generic, TypeVar

T = TypeVar("T")

#: Most messages one ModNodes call carries.
BATCH = 64

# Phases of a queue.
_IDLE = 0  # nothing to send and no call: the driver's worker may stop
_LINGER = 1  # a round starts at `due`; an urgent message brings it forward
_BACKOFF = 2  # after a failed call: nothing before `due`, whatever arrives
_NEXT = 3  # a round goes on: the next call is due at `due` (its start)
_FLIGHT = 4  # a call is in flight


class Entry(Generic[T]):
    """A queued message and what the queue knows of it."""

    __slots__ = ("item", "node_id", "remove", "reset", "tried", "urgent")

    def __init__(
        self, node_id: str, item: T, tried: int, reset: bool, urgent: bool, remove: bool
    ) -> None:
        self.node_id = node_id
        self.item = item
        #: sends that failed so far
        self.tried = tried
        #: send a REMOVE before it: it replaced a REMOVE (or a reset) unsent,
        #: so Schedule must forget the node's old incarnation first
        self.reset = reset
        #: a change (or it replaced an unsent change): send without lingering
        self.urgent = urgent
        #: the message is a REMOVE (not an UPSERT)
        self.remove = remove


class OutboxQueue(Generic[T]):
    """One Schedule address's queue of ModNode messages (see the module
    docstring). ``T`` is the driver's message; the queue reads nothing in it."""

    __slots__ = (
        "_entries",
        "_failures",
        "_flight",
        "_phase",
        "_urgent",
        "backoff_s",
        "batch",
        "due",
        "linger_s",
        "tries",
    )

    def __init__(
        self,
        *,
        batch: int = BATCH,
        tries: int = 3,
        backoff_s: float = 0.1,
        linger_s: float = 0.0,
    ) -> None:
        if linger_s < 0:
            raise ValueError("linger_s must be >= 0")
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.batch = batch
        self.tries = tries
        self.backoff_s = backoff_s
        self.linger_s = linger_s
        #: when the driver should next call poll (meaningless when idle or
        #: while a call is in flight)
        self.due = 0.0
        self._entries: dict[str, Entry[T]] = {}
        self._phase = _IDLE
        # An urgent message was queued since the round began: the next
        # round (after a backoff) does not linger. Cleared as a round
        # begins, not per call, as the asyncio outbox always did.
        self._urgent = False
        # Failed calls in a row (the backoff doubles, up to 32 times).
        self._failures = 0
        self._flight: list[Entry[T]] = []

    def __len__(self) -> int:
        """Messages queued (not those in flight)."""
        return len(self._entries)

    @property
    def idle(self) -> bool:
        """Nothing to send and no call in flight: the driver may stop."""
        return self._phase == _IDLE

    @property
    def in_flight(self) -> bool:
        """A call is in flight (between poll's batch and sent/failed)."""
        return self._phase == _FLIGHT

    def put(
        self, node_id: str, item: T, *, now: float, urgent: bool = True, remove: bool = False
    ) -> float | None:
        """Queue item for node_id. urgent=False: a refresh of an unchanged
        status, which may linger. remove: the item is a REMOVE.

        Returns the time the driver should wake and poll if put made it
        sooner (or the queue was idle), else None: a wake-up is already due
        no later, or a call is in flight (item goes with the next call)."""
        entries = self._entries
        prev = entries.pop(node_id, None)
        reset = False
        if prev is not None:
            # An UPSERT may replace a pending REMOVE only by carrying it
            # along: REMOVE + UPSERT is "forget the old incarnation, learn
            # this one". A refresh replacing an unsent change still carries
            # news.
            reset = not remove and (prev.remove or prev.reset)
            urgent = urgent or prev.urgent
        entries[node_id] = Entry(node_id, item, 0, reset, urgent, remove)
        if urgent:
            self._urgent = True
        phase = self._phase
        if phase == _IDLE:
            self._phase = _LINGER
            self.due = now if self._urgent else now + self.linger_s
            return self.due
        if phase == _LINGER and urgent and self.due > now:
            self.due = now
            return now
        return None

    def poll(self, now: float) -> list[Entry[T]] | float | None:
        """The wake-up the driver was given came (now >= due; earlier is
        harmless). Returns the batch to send now as one call (the queue is
        then in flight until sent or failed), a later time to poll again,
        or None: idle, nothing queued."""
        phase = self._phase
        if phase == _FLIGHT:
            raise RuntimeError("poll while a call is in flight")
        if phase == _IDLE:
            return None
        if now < self.due:
            return self.due
        if phase == _BACKOFF:
            if not self._entries:
                self._go_idle()
                return None
            # Retries (and what came meanwhile) of refreshes alone may
            # linger again; an urgent one goes now.
            self._phase = _LINGER
            if not self._urgent and self.linger_s > 0:
                self.due = now + self.linger_s
                return self.due
            self.due = now
        if self._phase == _LINGER:
            self._urgent = False  # a round begins
        return self._take()

    def _take(self) -> list[Entry[T]]:
        entries = self._entries
        # One message per node per call, calls in sequence, oldest first:
        # the order per node holds.
        if len(entries) <= self.batch:
            batch = list(entries.values())
            entries.clear()
        else:
            batch = [entries.pop(k) for k in list(islice(entries, self.batch))]
        self._flight = batch
        self._phase = _FLIGHT
        return batch

    def sent(self, now: float) -> float | None:
        """The call in flight succeeded. Returns when to poll next: now if
        messages are queued (they go at once: the round is paid for), else
        None (idle)."""
        self._check_flight()
        self._flight = []
        self._failures = 0
        if not self._entries:
            self._go_idle()
            return None
        self._phase = _NEXT
        self.due = now
        return now

    def failed(self, now: float) -> tuple[float, list[Entry[T]]]:
        """The call in flight failed. Its messages are queued again (at the
        end) unless tried ``tries`` times or superseded by a newer one for
        the node. Returns when to poll next (after the backoff, which
        nothing shortens) and the entries given up."""
        self._check_flight()
        self._failures += 1
        entries = self._entries
        lost: list[Entry[T]] = []
        for e in self._flight:
            if e.tried + 1 < self.tries and e.node_id not in entries:
                e.tried += 1
                entries[e.node_id] = e
                if e.urgent:
                    self._urgent = True
            else:
                lost.append(e)
        self._flight = []
        self._phase = _BACKOFF
        self.due = now + self.backoff_s * 2 ** min(self._failures - 1, 5)
        return self.due, lost

    def halt(self) -> None:
        """The driver stopped (cancelled): a call in flight is lost; what is
        queued stays, sent once a put wakes the queue again."""
        self._flight = []
        self._failures = 0
        self._phase = _IDLE

    def _go_idle(self) -> None:
        self._phase = _IDLE
        self._urgent = False
        self._failures = 0

    def _check_flight(self) -> None:
        if self._phase != _FLIGHT:
            raise RuntimeError("no call in flight")
