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

from controlplane.experiment import summarize


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
        self.n_completed = 0
        self.sums: dict[str, float] = defaultdict(float)
        nb = int(duration_s / self.bin_s) + 2
        self._completed = [0] * nb
        self._started = [0] * nb
        self._arrived = [0] * nb
        self.control: dict[str, list[tuple[float, int]]] = {}
        self.live: list[tuple[float, int]] = []
        self.first_scale_up = math.inf
        self.last_started = 0.0
        #: extra latency samples by name (e.g. Schedule's own decision time)
        self.extra: dict[str, array] = {}
        #: called with the time a client gets its slot (closed-loop drivers)
        self.on_grant: Callable[[float], None] | None = None

    def _bin(self, t: float) -> int:
        i = int(t / self.bin_s)
        return i if i < len(self._completed) else len(self._completed) - 1

    # -- requests -----------------------------------------------------------

    def arrived(self, times: Sequence[float]) -> None:
        """A batch of arrivals (counted per bin when the batch is read)."""
        arr, n, b = self._arrived, len(self._arrived) - 1, self.bin_s
        for t in times:
            i = int(t / b)
            arr[i if i < n else n] += 1

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
        i = int(t / self.bin_s)
        c = self._completed
        c[i if i < len(c) else -1] += 1
        self.n_completed += 1

    def failed(self, reason: str) -> None:
        """A request could not be served."""
        self.counts["failed"] += 1
        self.counts[f"failed.{reason}"] += 1

    # -- control plane ------------------------------------------------------

    def scheduled(self, asked_at: float, now: float) -> None:
        """A placement decision for a scale-up asked for at asked_at."""
        self.counts["placements"] += 1
        if asked_at >= self.warmup_s:
            self.sched.append(now - asked_at)
        self.first_scale_up = min(self.first_scale_up, asked_at)

    def started(self, t: float) -> None:
        """An instance became ready."""
        self._started[self._bin(t)] += 1
        self.counts["instances_started"] += 1
        self.last_started = max(self.last_started, t)

    def count(self, key: str, n: int = 1) -> None:
        """Bump a named counter (probes, spills, rejections, ...)."""
        self.counts[key] += n

    def sample(self, key: str, asked_at: float, value: float) -> None:
        """An extra latency sample (counted when asked after the warmup)."""
        if asked_at >= self.warmup_s:
            self.extra.setdefault(key, array("d")).append(value)

    def add(self, key: str, value: float) -> None:
        """Add to a named total (seconds of probing, of control CPU, ...)."""
        self.sums[key] += value

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
        self.counts["completed"] = self.n_completed
        started = self.counts["instances_started"]
        burst = self.last_started - self.first_scale_up if started else 0.0
        nb = min(len(self._completed), int(end / self.bin_s) + 1)
        # Sorted once here: summarize and _cdf_points sort again, which on
        # sorted input is a linear pass (millions of samples in long runs).
        # Kept as arrays of doubles: a quarter of the memory of a list.
        sched, dispatch = array("d", sorted(self.sched)), array("d", sorted(self.dispatch))
        return {
            "scheduling_latency_s": summarize(sched),
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


def _cdf_points(values: Sequence[float], n: int = 200) -> list[float]:
    """n+1 quantiles (0..100%) of values: enough to draw a CDF in a report."""
    if not values:
        return []
    v = sorted(values)
    return [v[min(len(v) - 1, round(i * (len(v) - 1) / n))] for i in range(n + 1)]
