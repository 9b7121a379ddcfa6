"""What every system model records, and its summary (the same for all).

Definitions (docs/simulator.md, "Metrics"):

- scheduling latency: from the moment the control plane asks for a new
  instance (the scale-up request is issued) until a node is chosen and the
  capacity reserved (the placement decision);
- dispatch latency: from a request's arrival until its client holds a slot
  on an instance (warm: routing only; cold: includes the cold start);
- cold-start latency: the dispatch latency of requests served by an instance
  started for them;
- throughput: requests completed per second and instances started per
  second (mean over the run, and peak over ``bin_s`` windows).
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from controlplane.bench.experiment import summarize

#: completion times binned at a time (see ``Recorder.completed``)
_FOLD = 1 << 16


class Recorder:
    """Samples and time series of one run (requests before warmup_s are
    served but not counted)."""

    def __init__(self, duration_s: float, warmup_s: float = 0.0, bin_s: float | None = None):
        self.duration_s = duration_s
        self.warmup_s = warmup_s
        self.bin_s = bin_s or max(1.0, duration_s / 600.0)
        self.sched = array("d")
        self.dispatch = array("d")
        self.cold = array("d")
        self.counts: dict[str, int] = defaultdict(int)
        #: completions already binned into ``_completed``
        self._n_folded = 0
        self.sums: dict[str, float] = defaultdict(float)
        nb = int(duration_s / self.bin_s) + 2
        self._completed = [0] * nb
        #: completion times not yet counted into ``_completed`` (binned in
        #: bulk, ``_FOLD`` at a time and by ``summary``: cheaper than one by one)
        self._completions = array("d")
        self._started = [0] * nb
        self._arrived = [0] * nb
        self.control: dict[str, list[tuple[float, int]]] = {}
        self.live: list[tuple[float, int]] = []
        self.first_scale_up = math.inf
        self.last_started = 0.0
        #: when each instance became ready (for the rate of the bulk of a burst)
        self._start_times = array("d")
        #: extra latency samples by name (e.g. Schedule's own decision time)
        self.extra: dict[str, array] = {}
        #: called with the time a client gets its slot (closed-loop drivers)
        self.on_grant: Callable[[float], None] | None = None
        #: ask times (after warmup) of every scale-up, and of those that
        #: ended (placed or given up): the rest were still waiting at the end
        self._asked = array("d")
        self._settled = array("d")

    def _bin(self, t: float) -> int:
        i = int(t / self.bin_s)
        return i if i < len(self._completed) else len(self._completed) - 1

    # -- requests -----------------------------------------------------------

    def arrived(self, times: Sequence[float]) -> None:
        """A batch of arrivals (counted per bin when the batch is read)."""
        _count_bins(self._arrived, times, self.bin_s)

    def granted(self, arrival: float, now: float, cold: bool) -> None:
        """A request's client got a slot at now."""
        if self.on_grant is not None:
            self.on_grant(now)
        if arrival < self.warmup_s:
            return
        lat = now - arrival
        self.dispatch.append(lat)
        if cold:
            self.cold.append(lat)

    def completed(self, t: float) -> None:
        """A request finished running."""
        c = self._completions
        c.append(t)
        if len(c) >= _FOLD:
            self._fold()

    @property
    def n_completed(self) -> int:
        """Requests completed so far (binned or held: no count per request)."""
        return self._n_folded + len(self._completions)

    def _fold(self) -> None:
        """Count the completion times held into ``_completed``."""
        _count_bins(self._completed, self._completions, self.bin_s)
        self._n_folded += len(self._completions)
        del self._completions[:]

    def failed(self, reason: str) -> None:
        """A request could not be served."""
        self.counts["failed"] += 1
        self.counts[f"failed.{reason}"] += 1

    # -- control plane ------------------------------------------------------

    def asked(self, now: float, n: int = 1) -> None:
        """``n`` scale-ups (instance starts) asked for now."""
        self.counts["scale_ups"] += n
        if now >= self.warmup_s:
            self._asked.extend([now] * n)

    def gave_up(self, asked_at: float) -> None:
        """A scale-up asked for at asked_at ended without a placement."""
        if asked_at >= self.warmup_s:
            self._settled.append(asked_at)

    def scheduled(self, asked_at: float, now: float) -> None:
        """A placement decision for a scale-up asked for at asked_at."""
        self.counts["placements"] += 1
        if asked_at >= self.warmup_s:
            self.sched.append(now - asked_at)
            self._settled.append(asked_at)
        # min(first_scale_up, asked_at), written out (a tenth of the cost)
        if asked_at < self.first_scale_up:
            self.first_scale_up = asked_at

    def started(self, t: float) -> None:
        """An instance became ready."""
        self._started[self._bin(t)] += 1
        self.counts["instances_started"] += 1
        self._start_times.append(t)
        if t > self.last_started:  # max(last_started, t), written out
            self.last_started = t

    def count(self, key: str, n: int = 1) -> None:
        """Bump a named counter (probes, spills, rejections, ...)."""
        self.counts[key] += n

    def sample(self, key: str, asked_at: float, value: float) -> None:
        """An extra latency sample (counted when asked after the warmup)."""
        if asked_at >= self.warmup_s:
            arr = self.extra.get(key)
            if arr is None:
                arr = self.extra[key] = array("d")
            arr.append(value)

    def add(self, key: str, value: float) -> None:
        """Add to a named total (seconds of probing, of control CPU, ...)."""
        self.sums[key] += value

    def _rate_99(self) -> float:
        """Instances started per second from the first scale-up to the start
        by which 99% of them had started."""
        n = len(self._start_times)
        if not n:
            return 0.0
        k = math.ceil(0.99 * n)
        t99 = float(np.partition(np.frombuffer(self._start_times, dtype=np.float64), k - 1)[k - 1])
        span = t99 - self.first_scale_up
        return k / span if span > 0 else 0.0

    def control_instances(self, t: float, kind: str, n: int) -> None:
        """The number of control instances of a kind changed to n at t."""
        series = self.control.setdefault(kind, [])
        if not series or series[-1][1] != n:
            series.append((t, n))

    def live_instances(self, t: float, n: int) -> None:
        """Sample of function instances alive at t."""
        self.live.append((t, n))

    # -- summary ------------------------------------------------------------

    def summary(self, end: float) -> dict[str, Any]:
        """Everything a report needs, as plain JSON-able data."""
        span = max(end - self.warmup_s, 1e-9)
        self._fold()
        self.counts["completed"] = self.n_completed
        started = self.counts["instances_started"]
        burst = self.last_started - self.first_scale_up if started else 0.0
        nb = min(len(self._completed), int(end / self.bin_s) + 1)
        # Sorted once here (summarize takes sorted arrays of doubles as they
        # are). Kept as arrays of doubles: a quarter of the memory of a list.
        sched, dispatch = _sorted(self.sched), _sorted(self.dispatch)
        waiting = unsettled(self._asked, self._settled, end)
        return {
            "scheduling_latency_s": summarize(sched),
            # Scale-ups still waiting for a placement at the end, as censored
            # samples (their wait so far, a lower bound): a system that
            # leaves work queued cannot look faster by not finishing it.
            "scale_ups_unplaced_at_end": len(waiting),
            "scheduling_latency_with_unplaced_s": (
                summarize(_sorted(array("d", [*sched, *waiting])))
                if len(waiting)
                else summarize(sched)
            ),
            "dispatch_latency_s": summarize(dispatch),
            "cold_start_latency_s": summarize(self.cold),
            "extra_latency_s": {k: summarize(v) for k, v in sorted(self.extra.items())},
            "throughput": {
                "requests_per_s": self.counts["completed"] / span,
                "instances_per_s": started / span,
                "peak_requests_per_s": max(self._completed[:nb], default=0) / self.bin_s,
                "peak_instances_per_s": max(self._started[:nb], default=0) / self.bin_s,
                # Instances started over the time from the first scale-up to
                # the last start: the scale-up rate a burst actually got.
                "scale_up_rate_per_s": started / burst if burst > 0 else 0.0,
                # The same over the first 99% of the starts: a few starts
                # long after a burst (the function autoscaler's next round)
                # do not stretch the burst's duration.
                "scale_up_rate_99_per_s": self._rate_99(),
            },
            "counts": dict(sorted(self.counts.items())),
            "sums": {k: round(v, 9) for k, v in sorted(self.sums.items())},
            "series": {
                "bin_s": self.bin_s,
                "arrived": self._arrived[:nb],
                "completed": self._completed[:nb],
                "instances_started": self._started[:nb],
                "control_instances": {k: [list(p) for p in v] for k, v in self.control.items()},
                "live_instances": [list(p) for p in self.live],
            },
            "samples": {
                "scheduling_latency_s": _cdf_points(sched),
                "dispatch_latency_s": _cdf_points(dispatch),
            },
        }


def unsettled(asked: Sequence[float], settled: Sequence[float], end: float) -> list[float]:
    """How long each scale-up asked for but never settled has waited at
    ``end``: the multiset difference ``asked - settled`` of ask times."""
    if len(asked) == len(settled):
        return []
    a_vals, a_counts = np.unique(np.asarray(asked, dtype=np.float64), return_counts=True)
    s_vals, s_counts = np.unique(np.asarray(settled, dtype=np.float64), return_counts=True)
    left = a_counts.copy()
    idx = np.searchsorted(a_vals, s_vals)
    ok = (idx < len(a_vals)) & (a_vals[np.minimum(idx, len(a_vals) - 1)] == s_vals)
    np.subtract.at(left, idx[ok], s_counts[ok])
    left = np.maximum(left, 0)
    return [float(end - t) for t in np.repeat(a_vals, left)]


def _count_bins(counts: list[int], times: Sequence[float], bin_s: float) -> None:
    """counts[min(int(t / bin_s), len(counts) - 1)] += 1 for each t: with
    numpy, all at once, when every t is finite and >= 0 (the same bins);
    else one by one."""
    n = len(counts) - 1
    t = np.asarray(times, dtype=np.float64)
    if len(t) and np.isfinite(t).all() and t.min() >= 0:
        binned = np.bincount(np.minimum(t / bin_s, n).astype(np.int64))
        for i in np.flatnonzero(binned).tolist():
            counts[i] += int(binned[i])
        return
    for x in times:
        i = int(x / bin_s)
        counts[i if i < n else n] += 1


def _sorted(values: array) -> array:
    """``array("d", sorted(values))``, by numpy (millions of samples). Equal
    doubles are the same value, so any sort gives the same sequence except
    for -0.0 and 0.0 (equal, yet told apart: a stable sort keeps them as
    Python's does); with NaN, Python's sort."""
    a = np.asarray(values, dtype=np.float64)
    if np.isnan(a).any():
        return array("d", sorted(values))
    stable = bool(np.signbit(a[a == 0]).any())
    return array("d", np.sort(a, kind="stable" if stable else "quicksort").tobytes())


def _cdf_points(v: Sequence[float], n: int = 200) -> list[float]:
    """n+1 quantiles (0..100%) of v (sorted): enough to draw a CDF in a report."""
    if not v:
        return []
    return [v[min(len(v) - 1, round(i * (len(v) - 1) / n))] for i in range(n + 1)]
