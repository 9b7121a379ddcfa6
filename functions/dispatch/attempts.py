"""The attempt loop of one instance start: a capacity credit first, then the
Schedule instances in rank order (spilling on no room, an unreachable
instance or a spec too big for a partition), then a retry when that may
help. Pure (no I/O, no clock): ``StartAttempts.next`` gives the next step
and the caller reports each step's outcome (``placed``, ``no_credit``,
``failed``). The Dispatch servicer (``starts.py``) performs the steps with
RPCs and ``asyncio.sleep``; the simulator's Galaxy model
(``simulator/galaxy/placement.py``) performs them as events.

A round, in order: ``UseCredit`` (when credits are on and the round may use
them), then ``AskSchedule`` for each of the first ``1 + max_spill`` ranked
Schedule instances until one places it. A round that ends without a place
ends as one of three failures:

- no room (RESOURCE_EXHAUSTED): while this Dispatch's spent credits still
  hold remainders (``CreditWallet.room_retry``), ``ReturnCredits`` and a
  new round; else ``GiveUp``;
- in doubt (UNAVAILABLE, a deadline, any other code): the start may yet
  complete, so ``Pause`` and a new round as the same id, through Schedule
  only (which joins the start in doubt), at most ``attempts`` rounds;
- never fits (FAILED_PRECONDITION from every partition, or the node agent
  refusing the spec): ``GiveUp``.

A start whose function was handed over meanwhile (``routed`` false) is not
tried again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")  # a Schedule instance, as the caller names it

#: Attempts of one instance start (under one id) that fails in doubt, and
#: the pause before the second (doubling after).
START_ATTEMPTS = 3
START_RETRY_S = 0.5
#: Outcome codes (gRPC status names) after which the next Schedule instance
#: is tried. Not DEADLINE_EXCEEDED: that placement may still be under way.
SPILL_ON = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE"})
NO_ROOM, IN_DOUBT, NEVER_FITS = "no_room", "in_doubt", "never_fits"


@dataclass(frozen=True)
class UseCredit(Generic[S]):
    """Create the instance from a credit that fits; ``ranked`` is this
    round's Schedule order (its first is the credits' home)."""

    ranked: Sequence[S]


@dataclass(frozen=True)
class AskSchedule(Generic[S]):
    """Ask ``schedule`` to place the instance (``spill``: not the first)."""

    schedule: S
    spill: bool


@dataclass(frozen=True)
class ReturnCredits:
    """Send back the spent credits' remainders; then ``next`` again."""


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds`` (a loaded Schedule), then ``next`` again."""

    seconds: float


@dataclass(frozen=True)
class GiveUp:
    """No instance: ``failure`` is NO_ROOM, IN_DOUBT or NEVER_FITS."""

    failure: str
    message: str


Step = UseCredit[S] | AskSchedule[S] | ReturnCredits | Pause | GiveUp


class StartAttempts(Generic[S]):
    """The attempt loop of one start (see module docstring)."""

    def __init__(
        self,
        what: str,
        ranked: Callable[[], Sequence[S]],
        max_spill: int,
        room_retry: Callable[[int], bool] | None,
        attempts: int = START_ATTEMPTS,
        retry_s: float = START_RETRY_S,
    ) -> None:
        #: how a message names the start ("an instance of f")
        self.what = what
        self._ranked = ranked
        self.max_spill = max_spill
        #: ``CreditWallet.room_retry`` (None: credits off)
        self.room_retry = room_retry
        self.attempts = attempts
        self.retry_s = retry_s
        self.credits = room_retry is not None
        self.room_retries = 0
        self.doubts = 0
        self._round_open = False
        self._ended: GiveUp | None = None
        self._cands: list[S] = []
        self._tried = 0
        self._reasons: list[str] = []
        self._code = "RESOURCE_EXHAUSTED"
        self._never = 0

    def _open(self) -> Step[S] | None:
        ranked = list(self._ranked())
        self._round_open = True
        self._cands = ranked[: 1 + self.max_spill]
        self._tried, self._never = 0, 0
        self._reasons, self._code = [], "RESOURCE_EXHAUSTED"
        if not self._cands:
            self._reasons.append("no Schedule instance is registered yet")
            self._code = "UNAVAILABLE"
        if self.credits:
            return UseCredit(ranked)
        return self._schedule()

    def _schedule(self) -> Step[S] | None:
        """The next Schedule instance to ask; None when the round is over."""
        if self._tried < len(self._cands) and (
            self._tried == 0 or self._code in SPILL_ON or self._code == "FAILED_PRECONDITION"
        ):
            s = self._cands[self._tried]
            self._tried += 1
            return AskSchedule(s, self._tried > 1)
        code = self._code
        if code == "FAILED_PRECONDITION" and self._never < len(self._reasons):
            code = "RESOURCE_EXHAUSTED"  # some partition may fit it later
        msg = f"cannot start {self.what}: " + "; ".join(self._reasons)
        if code == "RESOURCE_EXHAUSTED":
            self._end(GiveUp(NO_ROOM, msg))
        elif code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"):
            # Retrying will not help: the spec itself cannot be placed.
            self._end(GiveUp(NEVER_FITS, msg))
        else:
            self._end(GiveUp(IN_DOUBT, msg + "; retry later"))
        return None

    def _end(self, g: GiveUp) -> None:
        self._round_open, self._ended = False, g

    def next(self, routed: bool = True) -> Step[S]:
        """The next step. ``routed``: the start's router still routes its
        function here (a start handed over is not tried again)."""
        if self._ended is None:
            step = self._schedule() if self._round_open else self._open()
            if step is not None:
                return step
        g = self._ended
        assert g is not None
        if g.failure == NO_ROOM and self.room_retry is not None and routed:
            if self.room_retry(self.room_retries):
                self.room_retries += 1
                self._ended = None
                return ReturnCredits()
        if g.failure == IN_DOUBT:
            self.credits = False  # a retry goes through Schedule: it joins the start in doubt
            self.doubts += 1
            if self.doubts < self.attempts and routed:
                self._ended = None
                return Pause(self.retry_s * 2 ** (self.doubts - 1))
        return g

    @property
    def round_ended(self) -> GiveUp | None:
        """How the last round ended (None while one is under way)."""
        return self._ended

    # -- outcomes of the last step ------------------------------------------

    def no_credit(self) -> None:
        """``UseCredit`` found none, or the node refused it: Schedule places it."""

    def credit_failed(self, failure: str, message: str) -> None:
        """``UseCredit`` failed for good (NEVER_FITS) or in doubt (IN_DOUBT):
        the round ends so."""
        self._end(GiveUp(failure, message))

    def failed(self, code: str, reason: str) -> None:
        """``AskSchedule`` failed with gRPC status ``code``."""
        self._reasons.append(reason)
        self._code = code
        if code == "FAILED_PRECONDITION":
            self._never += 1  # too big for that partition; another may have larger nodes
