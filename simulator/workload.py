"""Workloads: functions and a seeded stream of (arrival, function, duration).

A ``Workload`` yields its arrivals in sorted batches (one per minute of a
trace, or per chunk of a synthetic process), so an 8-hour trace never sits
in memory at once and every system replays the very same requests (each call
to ``batches()`` restarts the same seeded stream).

Synthetic generators here; real traces in ``simulator.traces``; experiment
files (``controlplane.bench.experiment``) become workloads with ``from_plan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controlplane.bench.experiment import Plan, RequestProfile
from simulator.engine import Batch

#: Default sandbox start (cold start on the node): the measured spawn-to-ready
#: floor of a process sandbox, DESIGN.md section 6 (p50 ~77 ms).
DEFAULT_COLD_START_S = 0.077


@dataclass(frozen=True)
class FunctionDef:
    """A deployed function as the simulator sees it."""

    name: str
    cpu_millis: int = 250
    memory_mib: int = 128
    gpus: int = 0
    concurrency: int = 1
    max_scale: int = 1000
    cold_start_s: float = DEFAULT_COLD_START_S


@dataclass
class Workload:
    """Functions plus a restartable, seeded stream of arrival batches."""

    name: str
    functions: list[FunctionDef]
    duration_s: float
    make_batches: Callable[[], Iterator[Batch]]
    expected_requests: int = 0
    #: Requests arriving before this are not counted in the statistics.
    warmup_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def batches(self) -> Iterator[Batch]:
        """A fresh stream of the same arrivals."""
        return self.make_batches()

    def describe(self) -> dict[str, Any]:
        """For reports."""
        return {
            "name": self.name,
            "functions": len(self.functions),
            "duration_s": self.duration_s,
            "expected_requests": self.expected_requests,
            "warmup_s": self.warmup_s,
            "notes": self.notes,
        }


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Popularity of n functions, rank r with weight 1/r^s, normalised."""
    w = 1.0 / np.arange(1, n + 1, dtype=float) ** s
    return np.asarray(w / w.sum())


def _batch(t: np.ndarray, f: np.ndarray, d: np.ndarray) -> Batch:
    order = np.argsort(t, kind="stable")
    return t[order].tolist(), f[order].tolist(), d[order].tolist()


def _stream(
    rate: Callable[[float], float],
    duration_s: float,
    weights: np.ndarray,
    mean_duration_s: float,
    seed: int,
    chunk_s: float = 10.0,
) -> Iterator[Batch]:
    """A non-homogeneous Poisson process by thinning, chunk by chunk: in each
    chunk draw at the chunk's peak rate and keep each point with probability
    rate(t)/peak (Lewis and Shedler, 1979)."""
    rng = np.random.default_rng(seed)
    t0 = 0.0
    while t0 < duration_s:
        t1 = min(duration_s, t0 + chunk_s)
        grid = np.linspace(t0, t1, 9)
        peak = max(rate(float(x)) for x in grid) * 1.0001
        n = rng.poisson(peak * (t1 - t0))
        t = t0 + rng.random(n) * (t1 - t0)
        keep = rng.random(n) * peak < np.array([rate(float(x)) for x in t])
        t = t[keep]
        f = rng.choice(len(weights), size=len(t), p=weights)
        d = rng.exponential(mean_duration_s, size=len(t))
        yield _batch(t, f, d)
        t0 = t1


def functions(n: int, prefix: str = "fn", **kw: Any) -> list[FunctionDef]:
    """n identical functions named prefix-0..n-1."""
    return [FunctionDef(f"{prefix}-{i}", **kw) for i in range(n)]


def poisson(
    rate: float,
    duration_s: float,
    n_functions: int = 10,
    zipf_s: float = 1.0,
    mean_duration_s: float = 1.0,
    seed: int = 1,
    **fn: Any,
) -> Workload:
    """Poisson arrivals at ``rate``/s over Zipf-popular functions."""
    w = zipf_weights(n_functions, zipf_s)
    return Workload(
        f"poisson-{rate:g}rps",
        functions(n_functions, **fn),
        duration_s,
        lambda: _stream(lambda t: rate, duration_s, w, mean_duration_s, seed),
        int(rate * duration_s),
        notes=[
            f"Poisson {rate:g}/s, Zipf(s={zipf_s}) over {n_functions} functions, "
            f"exponential durations (mean {mean_duration_s:g} s)"
        ],
    )


def gamma(
    rate: float,
    shape: float,
    duration_s: float,
    n_functions: int = 10,
    zipf_s: float = 1.0,
    mean_duration_s: float = 1.0,
    seed: int = 1,
    **fn: Any,
) -> Workload:
    """Gamma renewal arrivals (CV of gaps 1/sqrt(shape)), via the shared
    ``RequestProfile``."""
    prof = RequestProfile("gamma", rate, shape)
    n = max(1, int(rate * duration_s))
    w = zipf_weights(n_functions, zipf_s)

    def make() -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        t = np.array([x for x in prof.arrivals(n, seed) if x < duration_s])
        f = rng.choice(n_functions, size=len(t), p=w)
        d = rng.exponential(mean_duration_s, size=len(t))
        yield t.tolist(), f.tolist(), d.tolist()

    return Workload(
        f"gamma-{rate:g}rps-k{shape:g}",
        functions(n_functions, **fn),
        duration_s,
        make,
        n,
        notes=[f"Gamma renewal, rate {rate:g}/s, shape {shape:g} (CV {1 / math.sqrt(shape):.2f})"],
    )


@dataclass(frozen=True)
class BurstShape:
    """A load curve like published serverless LLM load: a trough, then load
    doubling every ``double_s`` (<= 5 min) up to ``peak_ratio`` x trough,
    a plateau, and a fall back; repeated every ``period_s``."""

    trough_rps: float = 5.0
    peak_ratio: float = 256.0
    double_s: float = 30.0
    hold_s: float = 60.0
    fall_s: float = 60.0
    period_s: float = 600.0
    first_s: float = 60.0

    def rate(self, t: float) -> float:
        """Offered requests/s at time t."""
        rise = self.double_s * math.log2(self.peak_ratio)
        x = (t - self.first_s) % self.period_s if t >= self.first_s else -1.0
        if x < 0 or x >= rise + self.hold_s + self.fall_s:
            return self.trough_rps
        if x < rise:
            return self.trough_rps * 2 ** (x / self.double_s)
        if x < rise + self.hold_s:
            return self.trough_rps * self.peak_ratio
        frac = (x - rise - self.hold_s) / self.fall_s
        return self.trough_rps * self.peak_ratio ** (1 - frac)

    def mean_rate(self, duration_s: float, step: float = 1.0) -> float:
        """Average of rate over [0, duration_s)."""
        n = max(1, int(duration_s / step))
        return sum(self.rate(i * step) for i in range(n)) / n


def bursty(
    duration_s: float,
    shape: BurstShape | None = None,
    n_functions: int = 100,
    zipf_s: float = 0.8,
    mean_duration_s: float = 1.0,
    seed: int = 1,
    **fn: Any,
) -> Workload:
    """Bursts with peak/trough >= 200x and load doubling within minutes."""
    b = shape or BurstShape()
    w = zipf_weights(n_functions, zipf_s)
    return Workload(
        f"bursty-x{b.peak_ratio:g}",
        functions(n_functions, **fn),
        duration_s,
        lambda: _stream(b.rate, duration_s, w, mean_duration_s, seed),
        int(b.mean_rate(duration_s) * duration_s),
        notes=[
            f"bursts: trough {b.trough_rps:g}/s, peak {b.peak_ratio:g}x, load doubling every "
            f"{b.double_s:g} s, hold {b.hold_s:g} s, every {b.period_s:g} s; Zipf(s={zipf_s}) "
            f"over {n_functions} functions; exponential durations (mean {mean_duration_s:g} s)",
        ],
    )


def from_plan(plan: Plan, seed: int, **fn: Any) -> Workload:
    """An experiment-file plan as a workload.

    ``total_requests`` arrive per ``request_profile``; a ``cold_fraction``
    share goes to functions that have no instance yet (each such request to
    a fresh function), the rest to ``functions`` warm-able functions (scenario
    key, default 10) chosen uniformly. ``duration_s`` (scenario key, default
    0.1) is each request's run time. The first ``warmup_requests`` are not
    counted.
    """
    sc = plan.scenario
    n_warm = int(sc.extra.get("functions", 10))
    run_s = float(sc.extra.get("duration_s", 0.1))
    times = sc.profile.arrivals(sc.total_requests, seed)
    rng = np.random.default_rng(seed + 1)
    cold = rng.random(len(times)) < sc.cold_fraction
    fidx = rng.integers(0, n_warm, size=len(times))
    n_cold = int(cold.sum())
    fidx[cold] = n_warm + np.arange(n_cold)
    fdefs = functions(n_warm, "warm", **fn) + functions(n_cold, "cold", **fn)
    durs = [run_s] * len(times)
    # The first counted request: arrivals before it are the warmup.
    warm_s = times[sc.warmup_requests] if sc.warmup_requests else 0.0
    return Workload(
        plan.label or sc.name,
        fdefs,
        times[-1] + run_s,
        lambda: iter([(times, fidx.tolist(), durs)]),
        len(times),
        warmup_s=warm_s,
        notes=[
            f"experiment plan {plan.label}: {sc.total_requests} requests, "
            f"{sc.profile.distribution} at {sc.profile.arrival_rate:g}/s, "
            f"cold fraction {sc.cold_fraction:g}, {n_warm} warm functions"
        ],
    )


def flood(
    n_requests: int,
    rate: float,
    n_functions: int,
    duration_s: float,
    hold_s: float = 1e6,
    seed: int = 1,
    **fn: Any,
) -> Workload:
    """Cold starts at a rate: Poisson arrivals, requests spread round-robin
    over functions of concurrency 1, each holding its instance for hold_s
    (default: the whole run), so every request needs a new instance. The
    run lasts duration_s (the time systems get to catch up)."""
    prof = RequestProfile("poisson", rate)
    times = [t for t in prof.arrivals(n_requests, seed) if t < duration_s]
    fidx = [i % n_functions for i in range(len(times))]
    durs = [hold_s] * len(times)
    return Workload(
        f"flood-{n_requests}",
        functions(n_functions, "cold", **fn),
        duration_s,
        lambda: iter([(times, fidx, durs)]),
        len(times),
        notes=[
            f"{len(times)} cold starts, Poisson at {rate:g}/s over {n_functions} functions "
            f"(each request holds its instance); run {duration_s:g} s"
        ],
    )
