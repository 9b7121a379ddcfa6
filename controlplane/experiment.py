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
    v = sorted(values)
    n = len(v)
    return {
        "count": n,
        "mean": statistics.fmean(v) if n else math.nan,
        "stddev": statistics.stdev(v) if n > 1 else 0.0 if n else math.nan,
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p95": percentile(v, 95),
        "p99": percentile(v, 99),
        "max": v[-1] if n else math.nan,
    }
