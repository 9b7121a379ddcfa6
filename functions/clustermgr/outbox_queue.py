"""The queueing decisions of ClusterMgr's outbox to one Schedule instance.
Pure: no I/O, time passed in.

One queue per Schedule address. The newest message per node replaces an
unsent older one (and goes to the end). Each message says how long it may
wait for company (``wait_s``: 0 for news Schedule must have at once; what
the caller chooses for the rest -- ``functions.clustermgr.forwarding``
decides it); a queue sends when its earliest deadline comes, with
everything queued. A replacing message keeps the earlier deadline of the
two, so nothing waits past what it was promised. A round sends what is
queued in calls of up to ``batch`` messages and goes on until the queue is
empty: what arrives while a call is in flight goes with the next call. A
failed call's messages are retried (up to ``tries`` sends each, unless a
newer one for the node was queued meanwhile) after a backoff, after which
each may wait its own allowance again.

The driver (``functions.clustermgr.outbox.Outbox`` with asyncio and gRPC;
``simulator.galaxy.modnodes`` on the simulated clock) performs the calls::

    t = q.put(node_id, msg, now=now, wait_s=w)  # not None: wake at t (earlier)
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
_LINGER = 1  # a round starts at `due`, the earliest deadline queued
_BACKOFF = 2  # after a failed call: nothing before `due`, whatever arrives
_NEXT = 3  # a round goes on: the next call is due at `due` (its start)
_FLIGHT = 4  # a call is in flight


class Entry(Generic[T]):
    """A queued message and what the queue knows of it."""

    __slots__ = ("deadline", "item", "node_id", "remove", "reset", "tried", "wait_s")

    def __init__(
        self,
        node_id: str,
        item: T,
        tried: int,
        reset: bool,
        wait_s: float,
        deadline: float,
        remove: bool,
    ) -> None:
        self.node_id = node_id
        self.item = item
        #: sends that failed so far
        self.tried = tried
        #: send a REMOVE before it: it replaced a REMOVE (or a reset) unsent,
        #: so Schedule must forget the node's old incarnation first
        self.reset = reset
        #: how long it may wait for company (the least of the messages it
        #: replaced: a refresh replacing an unsent change still carries news)
        self.wait_s = wait_s
        #: when it must be sent at the latest (the backoff aside)
        self.deadline = deadline
        #: the message is a REMOVE (not an UPSERT)
        self.remove = remove

    @property
    def urgent(self) -> bool:
        """It may not wait for company."""
        return self.wait_s <= 0.0


class OutboxQueue(Generic[T]):
    """One Schedule address's queue of ModNode messages (see the module
    docstring). ``T`` is the driver's message; the queue reads nothing in it."""

    __slots__ = (
        "_entries",
        "_failures",
        "_flight",
        "_phase",
        "backoff_s",
        "batch",
        "due",
        "tries",
    )

    def __init__(self, *, batch: int = BATCH, tries: int = 3, backoff_s: float = 0.1) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.batch = batch
        self.tries = tries
        self.backoff_s = backoff_s
        #: when the driver should next call poll (meaningless when idle or
        #: while a call is in flight)
        self.due = 0.0
        self._entries: dict[str, Entry[T]] = {}
        self._phase = _IDLE
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
        self, node_id: str, item: T, *, now: float, wait_s: float = 0.0, remove: bool = False
    ) -> float | None:
        """Queue item for node_id; it may wait up to ``wait_s`` for company
        (0: send now). remove: the item is a REMOVE.

        Returns the time the driver should wake and poll if put made it
        sooner (or the queue was idle), else None: a wake-up is already due
        no later, or a call is in flight (item goes with the next call)."""
        if wait_s < 0:
            raise ValueError("wait_s must be >= 0")
        entries = self._entries
        prev = entries.pop(node_id, None)
        reset = False
        deadline = now + wait_s
        if prev is not None:
            # An UPSERT may replace a pending REMOVE only by carrying it
            # along: REMOVE + UPSERT is "forget the old incarnation, learn
            # this one". Whatever replaces a message keeps its promise.
            reset = not remove and (prev.remove or prev.reset)
            wait_s = min(wait_s, prev.wait_s)
            deadline = min(deadline, prev.deadline)
        entries[node_id] = Entry(node_id, item, 0, reset, wait_s, deadline, remove)
        phase = self._phase
        if phase == _IDLE:
            self._phase = _LINGER
            if len(entries) > 1:  # kept by ``halt``: their deadlines count too
                deadline = max(now, min(e.deadline for e in entries.values()))
            self.due = deadline
            return deadline
        if phase == _LINGER and deadline < self.due:
            self.due = deadline
            return deadline
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
            # Retries (and what came meanwhile) wait up to their deadlines
            # again: messages that may wait for company may linger anew.
            self._phase = _LINGER
            self.due = min(e.deadline for e in self._entries.values())
            if self.due > now:
                return self.due
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
        the node; each may wait its allowance again after the backoff.
        Returns when to poll next (after the backoff, which nothing
        shortens) and the entries given up."""
        self._check_flight()
        self._failures += 1
        self.due = now + self.backoff_s * 2 ** min(self._failures - 1, 5)
        entries = self._entries
        lost: list[Entry[T]] = []
        for e in self._flight:
            if e.tried + 1 < self.tries and e.node_id not in entries:
                e.tried += 1
                e.deadline = self.due + e.wait_s
                entries[e.node_id] = e
            else:
                lost.append(e)
        self._flight = []
        self._phase = _BACKOFF
        return self.due, lost

    def halt(self) -> None:
        """The driver stopped (cancelled): a call in flight is lost; what is
        queued stays, sent once a put wakes the queue again."""
        self._flight = []
        self._failures = 0
        self._phase = _IDLE

    def _go_idle(self) -> None:
        self._phase = _IDLE
        self._failures = 0

    def _check_flight(self) -> None:
        if self._phase != _FLIGHT:
            raise RuntimeError("no call in flight")
