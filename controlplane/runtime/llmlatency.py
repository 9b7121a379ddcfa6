"""A function's recent TTFT and TPOT, from its instances' latency histograms
(pure: the caller passes ``now``).

Each scrape of an instance gives cumulative histogram buckets since the
instance started (``llmsignals.Sample.ttft``/``tpot``). ``LatencyWindow``
keeps the difference between consecutive scrapes of each instance, stamped
with the scrape's time, and answers a percentile of everything observed by
the whole fleet within the last ``window_s`` the way Prometheus'
``histogram_quantile`` does (linear within the bucket holding the rank; the
largest finite bound when the rank falls in +Inf). The autoscaler reads it
over its own window rather than per tick, and admission reads the rate of
first tokens (how fast the fleet takes requests off its queues).

An instance's first scrape is a baseline only: what it counted before is not
known to be recent. A count that went down (the instance restarted) starts a
new baseline at zero, as Prometheus' ``rate`` does. Bounded: at most
``max_entries`` deltas are kept (the oldest go first).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controlplane.runtime.llmsignals import Buckets

#: vLLM's bucket bounds (vllm/v1/metrics/loggers.py), which the emulated
#: server and the simulator use too, so percentiles read from them have
#: vLLM's resolution
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip

#: a delta: (time, {upper bound: cumulative count}) of TTFT or TPOT
_Delta = tuple[float, dict[float, float]]


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """The ``q`` quantile (0-1) of cumulative bucket counts by upper bound
    (+Inf included), interpolated as Prometheus' ``histogram_quantile``;
    None when nothing was observed."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= rank and c > below:
            if math.isinf(b):
                return lower  # past the largest finite bound: that bound
            return lower + (b - lower) * (rank - below) / (c - below)
        lower, below = (b if not math.isinf(b) else lower), c
    return lower


def _delta(new: Buckets, old: Buckets | None) -> dict[float, float] | None:
    """new - old by bound (None: nothing new); a count that went down is a
    restart: new counts from zero."""
    before = dict(old) if old is not None else {}
    if any(c < before.get(b, 0.0) for b, c in new):
        before = {}
    out = {b: c - before.get(b, 0.0) for b, c in new}
    return out if out and max(out.values()) > 0 else None


@dataclass(frozen=True)
class Latency:
    """A fleet's recent latency: p90 TTFT and TPOT (None: none observed in
    the window) and first tokens per second."""

    ttft_s: float | None
    tpot_s: float | None
    first_tokens_per_s: float


class Histogram:
    """Cumulative bucket counts of observations (what a simulated instance
    exports in place of a Prometheus histogram)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = (*bounds, math.inf)
        self._counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        """Count one observation."""
        for k, b in enumerate(self.bounds):
            if value <= b:
                self._counts[k] += 1
                return

    def cumulative(self) -> Buckets:
        """(upper bound, count of observations <= it), ascending, +Inf last."""
        out, n = [], 0
        for b, c in zip(self.bounds, self._counts, strict=True):
            n += c
            out.append((b, float(n)))
        return tuple(out)


class LatencyWindow:
    """Recent TTFT/TPOT of one function's instances (module docstring)."""

    def __init__(self, window_s: float = 60.0, max_entries: int = 4096) -> None:
        if not window_s > 0:
            raise ValueError("window_s: must be > 0")
        self.window_s = window_s
        self._last: dict[str, tuple[Buckets | None, Buckets | None]] = {}
        self._ttft: deque[_Delta] = deque(maxlen=max_entries)
        self._tpot: deque[_Delta] = deque(maxlen=max_entries)
        #: when the first delta could have been counted (the first baseline)
        self._since: float | None = None

    def observe(
        self, instance: str, ttft: Buckets | None, tpot: Buckets | None, now: float
    ) -> None:
        """One scrape of ``instance``'s histograms (cumulative) at ``now``."""
        prev = self._last.get(instance)
        self._last[instance] = (ttft, tpot)
        if self._since is None:
            self._since = now
        if prev is None:
            return  # a baseline
        for new, old, into in ((ttft, prev[0], self._ttft), (tpot, prev[1], self._tpot)):
            if new is not None:
                d = _delta(new, old)
                if d is not None:
                    into.append((now, d))
        self._prune(now)

    def forget(self, instance: str) -> None:
        """The instance is gone (what it reported stays until it ages out)."""
        self._last.pop(instance, None)

    def instances(self) -> set[str]:
        """The instances with a baseline."""
        return set(self._last)

    def latency(self, now: float, q: float = 0.9, window_s: float | None = None) -> Latency:
        """The ``q`` quantiles of TTFT and TPOT over the last ``window_s``
        (default: the window's), and first tokens per second over it."""
        w = self.window_s if window_s is None else min(window_s, self.window_s)
        self._prune(now)
        ttft, n = _sum(self._ttft, now - w)
        tpot, _ = _sum(self._tpot, now - w)
        span = min(w, now - self._since) if self._since is not None else 0.0
        return Latency(quantile(q, ttft), quantile(q, tpot), n / span if span > 0 else 0.0)

    def _prune(self, now: float) -> None:
        cutoff = now - self.window_s
        for dq in (self._ttft, self._tpot):
            while dq and dq[0][0] <= cutoff:
                dq.popleft()


def _sum(deltas: Iterable[_Delta], after: float) -> tuple[dict[float, float], float]:
    """Bucket counts summed over the deltas stamped after ``after``, and
    how many observations they hold."""
    total: dict[float, float] = {}
    for t, d in deltas:
        if t > after:
            for b, c in d.items():
                total[b] = total.get(b, 0.0) + c
    return total, total.get(math.inf, 0.0)
