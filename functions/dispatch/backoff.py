"""Start backoff (pure, injected clock): a function whose instance starts
keep failing (its command exits at once, its model's checksum does not
match, no node has room for it) is not started again at every request.

After ``BackoffConfig.after`` failed starts in a row, the next start waits
``base_s``, then ``base_s x factor``, ... up to ``cap_s``. Meanwhile
Dispatch starts nothing for it, and a request that only a start could serve
fails at once, naming the function, the last start error and when the next
attempt is (``Failing.message``). A started instance, or a new spec version
of the function (a fix redeployed), ends the backoff.

Dispatch calls ``failed`` when a start fails and ``succeeded`` when one
serves; ``failed`` returns a ``Step`` only when a new backoff period begins,
so a burst of requests (or of starts launched together that fail together)
makes one log line per step, not one per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.runtime.clock import Clock


@dataclass(frozen=True)
class BackoffConfig:
    """How starts back off; the defaults are Dispatch's flags' defaults."""

    #: Failed starts in a row before the first backoff (one failure may be
    #: a node that died under the start: the next start goes elsewhere).
    after: int = 2
    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 60.0
    #: Bound on the functions tracked at once (the oldest is forgotten).
    max_functions: int = 10_000
    #: Start failures that say nothing of the function: no node has room
    #: now (the autoscaler and the caller's retries are the answer to that).
    not_counted: tuple[str, ...] = ("RESOURCE_EXHAUSTED",)


@dataclass
class Failing:
    """A function whose last starts failed."""

    version: int
    #: Failed starts in a row.
    failures: int
    #: The last start's error.
    error: str
    #: When the next start may be tried (clock time); <= now: it may.
    retry_at: float

    def message(self, function: str, now: float) -> str:
        """What a request refused during the backoff is told."""
        return (
            f"function {function}: its last {self.failures} starts failed; next attempt in "
            f"{max(0.0, self.retry_at - now):.1f}s; last error: {self.error}"
        )


@dataclass(frozen=True)
class Step:
    """A new backoff period: what its one log line says."""

    function: str
    failures: int
    delay_s: float
    error: str


class StartBackoff:
    """Failed starts per function and the backoff they earn."""

    def __init__(self, config: BackoffConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._failing: dict[str, Failing] = {}

    def delay_s(self, failures: int) -> float:
        """The backoff after failures starts in a row (0 below ``after``)."""
        c = self.config
        if failures < c.after:
            return 0.0
        return float(min(c.cap_s, c.base_s * c.factor ** (failures - c.after)))

    def failed(self, function: str, version: int, error: str, code: str = "") -> Step | None:
        """A start of function (spec version) failed with error (status code
        name); a Step when this begins a new backoff period."""
        if code in self.config.not_counted:
            return None
        now = self.clock.now()
        f = self._failing.get(function)
        if f is not None and f.version == version and now < f.retry_at:
            f.error = error  # a start begun before this period: same step
            return None
        failures = f.failures + 1 if f is not None and f.version == version else 1
        delay = self.delay_s(failures)
        self._failing.pop(function, None)  # re-inserted last: the newest
        self._failing[function] = Failing(version, failures, error, now + delay)
        while len(self._failing) > self.config.max_functions:
            del self._failing[next(iter(self._failing))]
        return Step(function, failures, delay, error) if delay > 0 else None

    def succeeded(self, function: str) -> None:
        """A start of function served: its backoff ends."""
        self._failing.pop(function, None)

    def blocked(self, function: str, version: int) -> Failing | None:
        """The failing state if function (at spec version) may not be
        started now, else None."""
        f = self._failing.get(function)
        if f is None or f.version != version or f.retry_at <= self.clock.now():
            return None
        return f

    def state(self, function: str) -> Failing | None:
        """The failing state of function, blocked or not (for status)."""
        return self._failing.get(function)
