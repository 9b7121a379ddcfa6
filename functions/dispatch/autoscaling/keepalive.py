"""Keep-alive policies: how long an idle function keeps its last instance.

Pure: no I/O; time comes in as arguments. One policy object per function. The
autoscaler (``functions.dispatch.autoscaling.kpa.KpaAutoscaler``) tells it when the
function goes idle (no request in flight or queued) and when the first request
after an idle period arrives, and asks it two questions:

* ``keep_alive_s(now)``: how long the last instance is kept loaded, counted
  from the end of the pre-warm window (from the idle start when there is none);
* ``prewarm_s(now)``: how long after going idle the function may stay
  unloaded before an instance is started again ahead of the predicted next
  request (0 = no pre-warming: keep the instance loaded from the idle start).

So after an idle start at time t0 the function wants an instance during
``[t0 + prewarm, t0 + prewarm + keep_alive)`` and none outside it (until the
next request). These are the two windows of the hybrid histogram policy of
Shahrad et al., "Serverless in the Wild: Characterizing and Optimizing the
Serverless Workload at a Large Cloud Provider", USENIX ATC 2020 (section 4).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "FixedKeepAlive",
    "HybridHistogramKeepAlive",
    "KeepAlivePolicy",
    "make_keepalive",
]


@runtime_checkable
class KeepAlivePolicy(Protocol):
    """What the autoscaler needs from a keep-alive policy (one per function)."""

    def on_invocation(self, now: float) -> None:
        """The first request after an idle period arrived at ``now``."""
        ...

    def on_idle_start(self, now: float) -> None:
        """The function became idle at ``now`` (nothing in flight or queued)."""
        ...

    def keep_alive_s(self, now: float) -> float:
        """Seconds an instance is kept loaded (after the pre-warm window)."""
        ...

    def prewarm_s(self, now: float) -> float:
        """Seconds after the idle start before pre-warming (0 = none)."""
        ...


def _check_number(
    owner: str,
    name: str,
    value: float,
    *,
    low: float,
    strict: bool = False,
    high: float = math.inf,
    high_strict: bool = False,
    integer: bool = False,
) -> float:
    """``value`` if it is a finite number in the given bounds; otherwise a
    ValueError naming ``owner.name`` and the rule."""
    kind = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")
    if value < low or (strict and value == low):
        raise ValueError(f"{owner}.{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")
    if value > high or (high_strict and value == high):
        raise ValueError(
            f"{owner}.{name} must be {'<' if high_strict else '<='} {high:g}, got {value!r}"
        )
    return value


class FixedKeepAlive:
    """Keep the last instance loaded for a fixed time after the idle start.

    The state of the practice the ATC'20 paper compares against: AWS Lambda
    keeps an idle instance about 10 minutes, Azure Functions 20 (as reported
    in the paper). ``FixedKeepAlive(0)`` leaves the decision to the
    autoscaler's scale-to-zero grace period alone.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = float(_check_number("FixedKeepAlive", "seconds", seconds, low=0.0))

    def on_invocation(self, now: float) -> None:
        """Ignored: a fixed policy learns nothing."""

    def on_idle_start(self, now: float) -> None:
        """Ignored: a fixed policy learns nothing."""

    def keep_alive_s(self, now: float) -> float:
        """The configured number of seconds."""
        return self.seconds

    def prewarm_s(self, now: float) -> float:
        """Always 0: never unload early and pre-warm."""
        return 0.0

    def __repr__(self) -> str:
        return f"FixedKeepAlive({self.seconds:g})"


class HybridHistogramKeepAlive:
    """The hybrid histogram policy of "Serverless in the Wild" (ATC'20).

    Per function, a range-limited histogram of idle times (the time from the
    idle start to the next request), with ``bin_s`` bins over ``range_s``
    (the paper: 1-minute bins, a 4-hour range, 240 bins). Three cases, as in
    the paper:

    1. **Representative histogram** (``min_samples`` idle times in range and
       the coefficient of variation of the bin counts >= ``cv_threshold``; a
       peaked histogram has a high CV, a flat one a low CV). Pre-warm window =
       the ``head_percentile`` (5th) of idle times minus a ``margin`` (10%);
       keep-alive window = the ``tail_percentile`` (99th) plus the margin,
       minus the pre-warm window. Percentiles are read at bin resolution: the
       head bin's lower edge and the tail bin's upper edge, so rounding errs
       toward keeping warm. A head of 0 means no pre-warming (the instance
       stays loaded from the idle start for the keep-alive window).
    2. **Too many out-of-bounds idle times** (a fraction >= ``oob_threshold``
       of all idle times is longer than the range). The paper forecasts the
       next idle time with ARIMA and uses it with a 15% margin (pre-warm at
       85% of the forecast, keep alive for 2 x 15% of it). **Simplification
       (ours):** instead of ARIMA the forecast is the median of the last
       ``forecast_samples`` idle times; the margins are the paper's
       (``oob_margin``). The ``oob_threshold`` default (0.5) is our choice.
    3. **Otherwise** (too few samples, or a flat histogram: an erratic
       function) the paper's conservative fallback: the standard keep-alive
       policy with the whole histogram range as keep-alive, no pre-warming.

    ``min_samples`` is our addition. With B bins and n idle times spread over
    n different bins, the CV of the bin counts is sqrt(B/n - 1), so below
    n = B / (cv_threshold**2 + 1) even a perfectly flat histogram passes the
    CV check and the check cannot tell erratic from periodic. The default
    is that bound (48 for 240 bins and CV 2); ``min_samples=1`` gives the
    paper's behaviour. The CV threshold 2 is the value used by public
    re-implementations of the paper's policy; it is configurable.
    """

    def __init__(
        self,
        *,
        bin_s: float = 60.0,
        range_s: float = 4 * 3600.0,
        head_percentile: float = 5.0,
        tail_percentile: float = 99.0,
        margin: float = 0.10,
        cv_threshold: float = 2.0,
        min_samples: int | None = None,
        oob_threshold: float = 0.5,
        oob_margin: float = 0.15,
        forecast_samples: int = 10,
    ) -> None:
        def check(name: str, value: float, **rule: Any) -> float:
            return _check_number("HybridHistogramKeepAlive", name, value, **rule)

        self.bin_s = float(check("bin_s", bin_s, low=0.0, strict=True))
        self.range_s = float(check("range_s", range_s, low=self.bin_s))
        self.head_percentile = float(check("head_percentile", head_percentile, low=0, high=100))
        self.tail_percentile = float(
            check("tail_percentile", tail_percentile, low=self.head_percentile, high=100)
        )
        self.margin = float(check("margin", margin, low=0, high=1, high_strict=True))
        self.cv_threshold = float(check("cv_threshold", cv_threshold, low=0))
        self.n_bins = math.ceil(self.range_s / self.bin_s - 1e-9)
        if min_samples is None:
            # Below this even a flat histogram passes the CV check (see above).
            min_samples = math.ceil(self.n_bins / (self.cv_threshold**2 + 1.0))
        self.min_samples = int(check("min_samples", min_samples, low=1, integer=True))
        self.oob_threshold = float(
            check("oob_threshold", oob_threshold, low=0, strict=True, high=1)
        )
        # Pre-warm at (1 - m) x forecast and keep 2m x forecast: m < 0.5.
        self.oob_margin = float(check("oob_margin", oob_margin, low=0, high=0.5, high_strict=True))
        forecast_samples = int(check("forecast_samples", forecast_samples, low=1, integer=True))
        self.counts = [0] * self.n_bins
        self.in_range = 0
        self.out_of_bounds = 0
        self._recent: deque[float] = deque(maxlen=forecast_samples)
        self._idle_start: float | None = None

    # -- events -------------------------------------------------------------

    def on_idle_start(self, now: float) -> None:
        """Remember when the idle period began."""
        self._idle_start = now

    def on_invocation(self, now: float) -> None:
        """Record the idle time that ends now (if an idle period was open)."""
        if self._idle_start is None:
            return  # busy, or the first request ever: no idle time to learn
        self.record_idle_time(max(0.0, now - self._idle_start))
        self._idle_start = None

    def record_idle_time(self, idle_s: float) -> None:
        """Add one idle time (seconds) to the histogram (also for replaying traces)."""
        idle_s = float(_check_number("HybridHistogramKeepAlive", "idle_s", idle_s, low=0.0))
        self._recent.append(idle_s)
        if idle_s >= self.range_s:
            self.out_of_bounds += 1
            return
        self.counts[min(int(idle_s // self.bin_s), self.n_bins - 1)] += 1
        self.in_range += 1

    # -- answers ------------------------------------------------------------

    def mode(self) -> str:
        """Which case applies now: "histogram", "out-of-bounds" or "fallback"."""
        total = self.in_range + self.out_of_bounds
        if total and self.out_of_bounds / total >= self.oob_threshold:
            return "out-of-bounds"
        if self.in_range >= self.min_samples and self.cv() >= self.cv_threshold:
            return "histogram"
        return "fallback"

    def cv(self) -> float:
        """Coefficient of variation (population stdev / mean) of the bin counts."""
        if self.in_range == 0:
            return 0.0
        return statistics.pstdev(self.counts) / (self.in_range / self.n_bins)

    def windows(self) -> tuple[float, float]:
        """(prewarm_s, keep_alive_s) for the current histogram."""
        mode = self.mode()
        if mode == "histogram":
            head = self._bin_at(self.head_percentile) * self.bin_s  # lower edge
            tail = (self._bin_at(self.tail_percentile) + 1) * self.bin_s  # upper edge
            prewarm = head * (1.0 - self.margin)
            return prewarm, tail * (1.0 + self.margin) - prewarm
        if mode == "out-of-bounds":
            forecast = statistics.median(self._recent)
            return forecast * (1.0 - self.oob_margin), forecast * 2.0 * self.oob_margin
        return 0.0, self.range_s

    def prewarm_s(self, now: float) -> float:
        """Pre-warm window in seconds (0 = keep loaded from the idle start)."""
        return self.windows()[0]

    def keep_alive_s(self, now: float) -> float:
        """Keep-alive window in seconds, after the pre-warm window."""
        return self.windows()[1]

    def _bin_at(self, percentile: float) -> int:
        """Index of the bin holding the given percentile of in-range idle times."""
        need = percentile / 100.0 * self.in_range
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if c and seen >= need:
                return i
        return self.n_bins - 1

    def __repr__(self) -> str:
        return (
            f"HybridHistogramKeepAlive(mode={self.mode()}, in_range={self.in_range}, "
            f"oob={self.out_of_bounds}, cv={self.cv():.2f})"
        )


_POLICIES: dict[str, type[FixedKeepAlive] | type[HybridHistogramKeepAlive]] = {
    "fixed": FixedKeepAlive,
    "hybrid": HybridHistogramKeepAlive,
}


def make_keepalive(name: str, **opts: Any) -> KeepAlivePolicy:
    """A new keep-alive policy by name: "fixed" (option ``seconds``, default 0)
    or "hybrid" (the options of ``HybridHistogramKeepAlive``)."""
    if name not in _POLICIES:
        raise ValueError(f"unknown keep-alive policy {name!r}; choose one of {sorted(_POLICIES)}")
    if name == "fixed":
        opts.setdefault("seconds", 0.0)
    try:
        policy: KeepAlivePolicy = _POLICIES[name](**opts)
    except TypeError as e:  # an unknown option: say which policy rejected it
        raise ValueError(f"keep-alive policy {name!r}: {e}") from None
    return policy
