"""Small parts of the reconcile loop: change notification, the record of a
scale action (what `galaxy status` shows), and the timeouts of its steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.controller.scaling import Decision
from controlplane.runtime.membership import KIND_BY_NAME
from galaxy.v1 import controller_pb2


class Changes:
    """Wakes coroutines waiting for a condition on the registry."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        """Something changed: every waiter re-checks its condition."""
        for f in self._waiters:
            if not f.done():
                f.set_result(None)
        self._waiters.clear()

    async def wait_for(self, pred: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until pred() is true (checked on every change); False on timeout."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not pred():
            left = end - loop.time()
            if left <= 0:
                return False
            fut = loop.create_future()
            self._waiters.add(fut)
            try:
                await asyncio.wait_for(fut, left)
            except TimeoutError:
                return pred()
            finally:
                self._waiters.discard(fut)
        return True


@dataclass
class ActionRecord:
    """A decision and what became of it (shown by `galaxy status`)."""

    decision: Decision
    decided_at_unix: float
    term: int
    detect_s: float = 0.0
    outcome: str = "pending"
    duration_s: float = 0.0
    instance_ids: list[str] = field(default_factory=list)
    #: Its ``ActionId`` as text (in the ledger, and the guard's key).
    action: str = ""

    def to_proto(self) -> controller_pb2.ScalingDecision:
        """As the status message."""
        d = self.decision
        return controller_pb2.ScalingDecision(
            kind=KIND_BY_NAME[d.kind],  # type: ignore[arg-type]
            from_instances=d.current,
            to_instances=d.desired,
            code=d.code,
            reason=d.reason,
            decided_at_unix=self.decided_at_unix,
            outcome=self.outcome,
            detect_s=self.detect_s,
            duration_s=self.duration_s,
            term=self.term,
            instance_ids=self.instance_ids,
        )


@dataclass
class Timeouts:
    """How long the steps of an action may take, and report freshness."""

    register_s: float = 60.0
    drain_grace_s: float = 1.0
    drain_s: float = 15.0
    #: Load reports older than this no longer count.
    report_fresh_s: float = 3.0
    #: A member silent this long that does not answer a health check either
    #: is removed (it died without deregistering).
    member_silent_s: float = 5.0
    #: A member adopted from the store at a takeover that has not reported
    #: to this leader yet is health-checked after this long instead: the old
    #: leader's own instances (local actuator) died with it, and until they
    #: are removed their partitions' requests wait (8.4 s after a kill in one
    #: CI run with member_silent_s alone, 2026-11-30).
    member_unconfirmed_s: float = 1.0


@dataclass(frozen=True, order=True)
class ActionId:
    """A scale action's identity: the term of the leader that decided it and
    that leader's count of decisions. Ordered: a later term is newer
    whatever its count (a new leader counts from 1 again)."""

    term: int
    seq: int

    def __str__(self) -> str:
        return f"{self.term}-{self.seq}"

    @classmethod
    def parse(cls, text: str) -> ActionId | None:
        """The id written as ``str(id)``; None if text is not one."""
        term, _, seq = text.partition("-")
        if not (term.isdigit() and seq.isdigit()):
            return None
        return cls(int(term), int(seq))


class AppliedActions:
    """Which scale actions were applied, per kind: so none is applied twice.

    Pure. An action is admitted once, and only if it is newer than every
    action applied (or adopted from a predecessor) for its kind: the same
    decision carried out again, or a deposed leader's older decision
    arriving after a newer leader's, is refused.
    """

    def __init__(self) -> None:
        self._last: dict[str, ActionId] = {}

    def last(self, kind: str) -> ActionId | None:
        """The newest action applied or adopted for kind."""
        return self._last.get(kind)

    def admit(self, kind: str, action: ActionId) -> bool:
        """True (and recorded as applied) if action may be applied now."""
        last = self._last.get(kind)
        if last is not None and action <= last:
            return False
        self._last[kind] = action
        return True

    def adopt(self, kind: str, action: ActionId) -> None:
        """A predecessor applied (or committed and the platform made real)
        action: never apply it, or anything older, again."""
        last = self._last.get(kind)
        if last is None or action > last:
            self._last[kind] = action
