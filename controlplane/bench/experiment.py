"""Experiment files, arrival processes and latency summaries, shared by
`galaxy bench` (real processes) and `galaxy simulate` (discrete events).

The file format follows DESIGN.md section 4:

    objectives: [...]            # optional, free-form (e.g. "p99_cold_start<50ms")
    scenarios:
      - name: burst              # optional
        total_requests: 300
        warmup_requests: 30
        cold_fraction: 0.1       # optional: share of requests to functions with no instance
        request_profile: {distribution: Poisson, arrival_rate: 15}   # per second
    parameters:
      - {name: schedule_instances, value: [1, 2, 4]}

Each combination of parameter values (their cartesian product) with each
scenario is one *plan*.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DISTRIBUTIONS = ("poisson", "gamma", "constant")


class ExperimentError(ValueError):
    """A malformed experiment file; the message names the field."""


@dataclass(frozen=True)
class RequestProfile:
    """How requests arrive: a distribution of inter-arrival times."""

    distribution: str = "poisson"
    arrival_rate: float = 10.0  # requests per second
    # Gamma shape k; CV of inter-arrivals = 1/sqrt(k). k < 1 is burstier than Poisson.
    shape: float = 0.5

    def arrivals(self, n: int, seed: int) -> list[float]:
        """n arrival times in seconds from 0, reproducible for a seed."""
        rng = random.Random(seed)
        t = 0.0
        out: list[float] = []
        mean = 1.0 / self.arrival_rate
        for _ in range(n):
            if self.distribution == "poisson":
                t += rng.expovariate(self.arrival_rate)
            elif self.distribution == "gamma":
                t += rng.gammavariate(self.shape, mean / self.shape)
            else:
                t += mean
            out.append(t)
        return out


@dataclass(frozen=True)
class Scenario:
    """One workload of an experiment."""

    name: str
    total_requests: int
    warmup_requests: int = 0
    cold_fraction: float = 0.0
    profile: RequestProfile = field(default_factory=RequestProfile)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A scenario with one value for every swept parameter."""

    scenario: Scenario
    params: dict[str, Any]

    @property
    def label(self) -> str:
        """Short human name, e.g. 'burst schedule_instances=2'."""
        ps = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.scenario.name} {ps}".strip()


@dataclass(frozen=True)
class Experiment:
    """A parsed experiment file."""

    name: str
    scenarios: list[Scenario]
    parameters: dict[str, list[Any]]
    objectives: list[str] = field(default_factory=list)

    def plans(self) -> Iterator[Plan]:
        """Every scenario x every combination of parameter values."""
        names = list(self.parameters)
        combos = itertools.product(*(self.parameters[n] for n in names)) if names else [()]
        for values in combos:
            for sc in self.scenarios:
                yield Plan(sc, dict(zip(names, values, strict=True)))


def _num(
    d: dict[str, Any], key: str, path: str, default: Any, lo: float, kind: type = float
) -> Any:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ExperimentError(f"{path}: must be a number, got {v!r}")
    if v < lo:
        raise ExperimentError(f"{path}: must be >= {lo}, got {v}")
    if kind is int and v != int(v):
        raise ExperimentError(f"{path}: must be a whole number, got {v}")
    return kind(v)


def parse(doc: Any, name: str = "experiment") -> Experiment:
    """Validate a parsed YAML document into an Experiment."""
    if not isinstance(doc, dict):
        raise ExperimentError("experiment: must be a mapping with 'scenarios'")
    raw = doc.get("scenarios")
    if not isinstance(raw, list) or not raw:
        raise ExperimentError("scenarios: required non-empty list")
    scenarios = []
    for i, s in enumerate(raw):
        path = f"scenarios[{i}]"
        if not isinstance(s, dict):
            raise ExperimentError(f"{path}: must be a mapping")
        total = _num(s, "total_requests", f"{path}.total_requests", 0, 1, int)
        warm = _num(s, "warmup_requests", f"{path}.warmup_requests", 0, 0, int)
        if warm >= total:
            raise ExperimentError(f"{path}.warmup_requests: must be less than total_requests")
        cold = _num(s, "cold_fraction", f"{path}.cold_fraction", 0.0, 0.0)
        if cold > 1:
            raise ExperimentError(f"{path}.cold_fraction: must be between 0 and 1")
        rp = s.get("request_profile", {}) or {}
        if not isinstance(rp, dict):
            raise ExperimentError(f"{path}.request_profile: must be a mapping")
        dist = str(rp.get("distribution", "poisson")).lower()
        if dist not in DISTRIBUTIONS:
            raise ExperimentError(
                f"{path}.request_profile.distribution: one of {', '.join(DISTRIBUTIONS)}, "
                f"got {rp.get('distribution')!r}"
            )
        rate = _num(rp, "arrival_rate", f"{path}.request_profile.arrival_rate", 10.0, 1e-9)
        shape = _num(rp, "shape", f"{path}.request_profile.shape", 0.5, 1e-6)
        known = {"name", "total_requests", "warmup_requests", "cold_fraction", "request_profile"}
        scenarios.append(
            Scenario(
                name=str(s.get("name", f"scenario{i}")),
                total_requests=total,
                warmup_requests=warm,
                cold_fraction=cold,
                profile=RequestProfile(dist, rate, shape),
                extra={k: v for k, v in s.items() if k not in known},
            )
        )
    params: dict[str, list[Any]] = {}
    for i, p in enumerate(doc.get("parameters", []) or []):
        if not isinstance(p, dict) or "name" not in p or "value" not in p:
            raise ExperimentError(f"parameters[{i}]: needs 'name' and 'value'")
        vals = p["value"] if isinstance(p["value"], list) else [p["value"]]
        if not vals:
            raise ExperimentError(f"parameters[{i}].value: must not be empty")
        params[str(p["name"])] = vals
    objectives = [str(o) for o in doc.get("objectives", []) or []]
    return Experiment(str(doc.get("name", name)), scenarios, params, objectives)


def load(path: str | Path) -> Experiment:
    """Read and validate an experiment file."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ExperimentError(f"cannot read {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ExperimentError(f"{p}: not valid YAML: {e}") from None
    return parse(doc, name=p.stem)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN if empty."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, stddev, p50, p90, p95, p99, max of a sample."""
    # An array of doubles that is sorted already is used as it is (the
    # simulator's are: millions of values).
    v = values if _is_sorted_doubles(values) else sorted(values)
    n = len(v)
    return {
        "count": n,
        "mean": statistics.fmean(v) if n else math.nan,
        "stddev": stdev(values if _is_doubles(values) else v) if n > 1 else 0.0 if n else math.nan,
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p95": percentile(v, 95),
        "p99": percentile(v, 99),
        "max": v[-1] if n else math.nan,
    }


#: below this many values ``stdev`` leaves the work to ``statistics.stdev``
_FAST_STDEV_MIN = 1000
#: values summed at a time (bounds numpy's temporary arrays: ~10 of them)
_CHUNK = 1 << 18


def stdev(values: Sequence[float]) -> float:
    """``statistics.stdev(values)``, the same float, and fast on large
    samples of floats (the simulator summarizes millions).

    ``statistics.stdev`` is exact: the square root, correctly rounded, of
    the sample variance computed in rationals -- and slow (about 0.6 us a
    value). Here the same exact sums are taken with numpy in integers: each
    double is m * 2**e with an integer m of 53 bits; sums of m and m**2 over
    values of equal e are exact in int64 once m is split into limbs, and
    they combine exactly as Python integers. The square root is rounded
    once, from an exact rational (``_sqrt_of_ratio``).
    """
    if len(values) >= _FAST_STDEV_MIN:
        fast = _exact_stdev(values)
        if fast is not None:
            return fast
    return statistics.stdev(values)


def _is_doubles(values: Sequence[float]) -> bool:
    return isinstance(values, array) and values.typecode == "d"


def _is_sorted_doubles(values: Sequence[float]) -> bool:
    """An ``array('d')`` in ascending order (and without NaN)."""
    if not _is_doubles(values) or len(values) < _FAST_STDEV_MIN:
        return False
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with matplotlib
        return False
    a = np.asarray(values, dtype=np.float64)
    return bool(np.all(a[:-1] <= a[1:]))


def _exact_stdev(values: Sequence[float]) -> float | None:
    """See ``stdev``; None when this way does not apply (numpy missing,
    values not all finite floats)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with matplotlib
        return None
    if not _is_doubles(values) and not all(type(x) is float for x in values):
        return None  # ints, Fractions, Decimals...: statistics handles their types
    a = np.asarray(values, dtype=np.float64)
    if not np.isfinite(a).all():
        return None
    n = len(a)
    mant, exp = np.frexp(a)
    # a = m * 2**(exp - 53) with m an integer, |m| < 2**53 (exact).
    m = np.ldexp(mant, 53).astype(np.int64)
    e0 = int(exp.min())
    shift = (exp - e0).astype(np.int64)
    sx = sxx = 0  # sum of m * 2**shift and of its square: Python ints, exact
    for lo in range(0, n, _CHUNK):
        sx_c, sxx_c = _chunk_sums(np, m[lo : lo + _CHUNK], shift[lo : lo + _CHUNK])
        sx += sx_c
        sxx += sxx_c
    # x = X * 2**k with X the integers summed: the variance is
    # 2**(2k) * (n * sxx - sx**2) / (n * (n - 1)), exactly.
    k = e0 - 53
    num, den = n * sxx - sx * sx, n * (n - 1)
    if k >= 0:
        num <<= 2 * k
    else:
        den <<= -2 * k
    return _sqrt_of_ratio(num, den)


def _chunk_sums(np: Any, m: Any, shift: Any) -> tuple[int, int]:
    """Exact sum of m * 2**shift and of (m * 2**shift)**2 over a chunk of
    at most 2**20 values (int64 arrays, |m| < 2**53): the bounds below
    hold up to that size."""
    if not bool(np.all(shift[1:] >= shift[:-1])):  # (sorted samples: already)
        order = np.argsort(shift, kind="stable")
        m, shift = m[order], shift[order]
    starts = np.flatnonzero(np.concatenate(([True], shift[1:] != shift[:-1])))
    # m = hi * 2**26 + lo (arithmetic shift: right for negative m too):
    # group sums stay below 2**48.
    hi, lo = m >> 26, m & ((1 << 26) - 1)
    # |m| = a2 * 2**36 + a1 * 2**18 + a0 with limbs below 2**18: products
    # below 2**36, their group sums below 2**56.
    u = np.abs(m)
    mask = (1 << 18) - 1
    a0, a1, a2 = u & mask, (u >> 18) & mask, u >> 36
    parts = [hi, lo, a0 * a0, a0 * a1, a1 * a1, a0 * a2, a1 * a2, a2 * a2]
    sums = [np.add.reduceat(p, starts).tolist() for p in parts]
    sx = sxx = 0
    for g, s in enumerate(shift[starts].tolist()):
        s_hi, s_lo, s00, s01, s11, s02, s12, s22 = (col[g] for col in sums)
        sx += ((s_hi << 26) + s_lo) << s
        sq = s00 + (s01 << 19) + ((s11 + 2 * s02) << 36) + (s12 << 55) + (s22 << 72)
        sxx += sq << (2 * s)
    return sx, sxx


def _sqrt_of_ratio(num: int, den: int) -> float:
    """sqrt(num / den) correctly rounded to a float (num >= 0, den > 0)."""
    if num == 0:
        return 0.0
    # r = floor(2**q * sqrt(num / den)) with at least 57 bits, 4 more than
    # a double has; when the root is inexact its last bit is set (a sticky
    # bit: "round to odd"), so rounding r once to a double is correct.
    q = 57 - (num.bit_length() - den.bit_length()) // 2
    n2, d2 = (num << 2 * q, den) if q >= 0 else (num, den << -2 * q)
    r = math.isqrt(n2 // d2)
    if r * r * d2 != n2:
        r |= 1
    # int / int rounds correctly (subnormal results too)
    return r / (1 << q) if q >= 0 else math.ldexp(float(r), -q)
