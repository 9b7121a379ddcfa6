"""Which number a function's autoscaler scales on, and its SLO targets.

Knative's KPA scales on concurrency; an LLM's load is better read from its
engine: queue depth, KV-cache use, tokens/s (kserve #3561 and #4028, ray
#51632 ask for these). ``ScalingSignal`` names the metric, its target per
instance and optional TTFT/TPOT targets; the KPA (``kpa``) stays the same
state machine and is fed ``observed`` in place of concurrency with
``target_concurrency`` set to the metric's target (``kpa_config``), so its
windows, panic mode and scale-down rate apply to every metric alike.

SLO targets add pressure: when the fleet's recent p90 TTFT (or TPOT)
exceeds its target and no instance is starting, the observed value is
multiplied by the ratio, so the KPA asks for proportionally more instances
until latency is back under target. "Recent" is a window of the instances'
latency histograms (``controlplane.runtime.llmlatency``, read over
``LATENCY_WINDOW_S``), not one tick's requests: the pressure then moves as
the KPA's own windows do instead of jumping with each tick's few first
tokens. Pure.

Metrics (the fleet total is compared with target x instances):

================  =======================================  ===============
name              fleet value                              default target
================  =======================================  ===============
``concurrency``   requests in flight                       the function's
                                                           concurrency
``rps``           requests per second                      10
``queue``         requests waiting + running (engine)      8
``kv``            sum of KV-cache use (0-1 per instance)   0.7
``tokens_per_s``  generated tokens per second              1000
================  =======================================  ===============
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from functions.dispatch.autoscaling.kpaconfig import KpaConfig


class Load(Protocol):
    """One instance's scraped signals (``controlplane.runtime.llmsignals.Load``;
    services do not import each other, so this names only what is read)."""

    @property
    def queue(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    @property
    def tokens_per_s(self) -> float: ...


#: metric -> default target per instance (0: the function's concurrency)
METRICS: dict[str, float] = {
    "concurrency": 0.0,
    "rps": 10.0,
    "queue": 8.0,
    "kv": 0.7,
    "tokens_per_s": 1000.0,
}
#: an SLO target above this is a mistake (ms), not a target
SLO_MAX_S = 600.0
#: the latency window SLO pressure reads (s)
LATENCY_WINDOW_S = 12.0
#: SLO pressure at most: latency k times its target is a queue, which a
#: fraction more capacity drains, not k times the instances
PRESSURE_MAX = 2.0


@dataclass(frozen=True)
class ScalingSignal:
    """A function's scaling metric, target per instance and SLO targets
    (0: none)."""

    metric: str = "concurrency"
    #: per instance; 0 means the metric's default (``METRICS``)
    target: float = 0.0
    ttft_s: float = 0.0
    tpot_s: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(
                f"autoscaling.metric: {self.metric[:40]!r} is unknown (known: {', '.join(METRICS)})"
            )
        for name in ("target", "ttft_s", "tpot_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"autoscaling.{name}: must be a finite number")
            if v < 0:
                raise ValueError(f"autoscaling.{name}: must be >= 0")
        if self.metric == "kv" and self.target > 1:
            raise ValueError("autoscaling.target: KV use is a fraction, must be <= 1")
        for name in ("ttft_s", "tpot_s"):
            if getattr(self, name) > SLO_MAX_S:
                raise ValueError(f"autoscaling.{name}: must be <= {SLO_MAX_S:.0f}")

    @classmethod
    def from_spec(cls, doc: Mapping[str, Any]) -> ScalingSignal:
        """From a spec's ``autoscaling`` mapping: ``metric``, ``target``,
        ``ttft_ms``, ``tpot_ms`` (other keys are the KPA's and ignored
        here). ValueError naming the field."""
        for key in ("target", "ttft_ms", "tpot_ms"):
            v = doc.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"autoscaling.{key}: must be a number")
        metric = doc.get("metric", "concurrency")
        if not isinstance(metric, str):
            raise ValueError("autoscaling.metric: must be a string")
        return cls(
            metric=metric,
            target=float(doc.get("target", 0)),
            ttft_s=float(doc.get("ttft_ms", 0)) / 1000.0,
            tpot_s=float(doc.get("tpot_ms", 0)) / 1000.0,
        )

    @classmethod
    def from_proto(cls, a: Any) -> ScalingSignal:
        """From an ``AutoscalingSpec`` (checked by the controller, so a bad
        value here is a bug: ValueError)."""
        return cls(a.metric or "concurrency", a.target, a.ttft_ms / 1000.0, a.tpot_ms / 1000.0)

    def target_for(self, concurrency: int) -> float:
        """The target per instance (the function's concurrency for the
        concurrency metric when none is given)."""
        if self.target > 0:
            return self.target
        return METRICS[self.metric] or float(max(1, concurrency))


def fleet_value(
    signal: ScalingSignal, loads: Iterable[Load], concurrency: float, rps: float
) -> float:
    """The fleet total of the chosen metric: ``concurrency`` and ``rps``
    come from the router's own counts, the engine metrics from scraped
    loads (``controlplane.runtime.llmsignals``)."""
    m = signal.metric
    if m == "concurrency":
        return concurrency
    if m == "rps":
        return rps
    if m == "queue":
        return float(sum(x.queue for x in loads))
    if m == "kv":
        return sum(x.kv_usage for x in loads)
    return sum(x.tokens_per_s for x in loads)


def slo_pressure(signal: ScalingSignal, ttft_s: float | None, tpot_s: float | None) -> float:
    """>= 1: how far the observed TTFT/TPOT (a recent high percentile; None
    when unknown) exceed their targets; 1 when within or untargeted."""
    p = 1.0
    if signal.ttft_s > 0 and ttft_s is not None:
        p = max(p, ttft_s / signal.ttft_s)
    if signal.tpot_s > 0 and tpot_s is not None:
        p = max(p, tpot_s / signal.tpot_s)
    return min(p, PRESSURE_MAX)


def observed(
    signal: ScalingSignal,
    value: float,
    ttft_s: float | None,
    tpot_s: float | None,
    starting: int = 0,
    waiting: int | None = None,
) -> float:
    """What the KPA observes in place of concurrency. While instances are
    starting, latency reflects the wait for them rather than a shortage
    they will not fix, so SLO pressure is not applied (else every tick of a
    cold start asks for more instances). With nothing ``waiting`` (queued
    in the engines or for a slot; None: unknown), a TTFT over target is
    the prompts' own prefill, which more instances do not shorten: only
    TPOT, which a smaller batch does shorten, adds pressure then."""
    if starting > 0:
        return value
    if waiting == 0:
        ttft_s = None
    return value * slo_pressure(signal, ttft_s, tpot_s)


def kpa_config(signal: ScalingSignal, base: KpaConfig, concurrency: int) -> KpaConfig:
    """``base`` with its target set to the metric's target per instance."""
    return dataclasses.replace(base, target_concurrency=signal.target_for(concurrency))
