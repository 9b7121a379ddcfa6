"""The KPA's parameters (``KpaConfig``) and its per-tick answer
(``ScaleDecision``), apart from the autoscaler's state machine
(``functions.dispatch.autoscaling.kpa``, which re-exports both). Pure."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from controlplane.runtime.compiled import mypyc_attr
from functions.dispatch.autoscaling.settings import DEFAULTS, AutoscaleSettings

if TYPE_CHECKING:
    from galaxy.v1 import common_pb2

# Float slack: 2.1 concurrent / (3 x 0.7) is 1.0000000000000002 in floats and
# must give 1 instance, not 2.
_EPS = 1e-9
# Sums of non-negative whole numbers below 2**53 are exact in floats, in any
# order: up to there a running sum of whole-number samples equals the sum
# taken afresh, bit for bit.
_EXACT_SUM = 2**53
#: the panic window's share of the stable window (Knative's 10%); a spec's
#: panic_window_percent of 0 means this
PANIC_WINDOW_FRACTION = 0.1


def _instances_for(concurrency: float, per_instance: float) -> int:
    """ceil(concurrency / per_instance); any traffic at all needs one instance."""
    if concurrency <= 0:
        return 0
    n = math.ceil(concurrency / per_instance - _EPS)
    # (not max(1, n): the builtin costs ten times a conditional expression)
    return n if n > 1 else 1


# Not compiled: a compiled __init__ checks types without naming the field.
@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class KpaConfig:
    """Autoscaling parameters of one function. Defaults are Galaxy's; see
    ``knative_baseline`` for the Knative-like baseline of the simulator."""

    #: requests one instance should carry (the function's concurrency limit)
    target_concurrency: float
    #: fraction of target_concurrency to aim for (Knative default 0.7)
    target_utilization: float = DEFAULTS.target_utilization
    stable_window_s: float = DEFAULTS.stable_window_s
    #: panic window = stable_window_s x this (Knative: panic-window-percentage 10%)
    panic_window_fraction: float = PANIC_WINDOW_FRACTION
    #: panic when panic desired >= this x ready (Knative: 200%)
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace_s: float = DEFAULTS.scale_to_zero_grace_s
    min_scale: int = 0
    #: None = no upper bound
    max_scale: int | None = None
    #: how often the caller is expected to observe and decide (Knative: 2 s)
    tick_s: float = DEFAULTS.autoscale_tick_ms / 1000.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v, integer = getattr(self, f.name), f.name in ("min_scale", "max_scale")
            if v is None and f.name == "max_scale":
                continue
            kind_ok = isinstance(v, int) if integer else isinstance(v, (int, float))
            if isinstance(v, bool) or not kind_ok or not math.isfinite(v):
                what = "an integer" if integer else "a finite number"
                raise ValueError(f"KpaConfig.{f.name} must be {what}, got {v!r}")
        need = self._need
        need(self.target_concurrency > 0, "target_concurrency", "> 0")
        need(0 < self.target_utilization <= 1, "target_utilization", "in (0, 1]")
        need(self.stable_window_s > 0, "stable_window_s", "> 0")
        need(0 < self.panic_window_fraction <= 1, "panic_window_fraction", "in (0, 1]")
        need(self.panic_threshold > 1, "panic_threshold", "> 1 (Knative allows 1.1 to 10)")
        need(self.max_scale_up_rate > 1, "max_scale_up_rate", "> 1")
        need(self.max_scale_down_rate > 1, "max_scale_down_rate", "> 1")
        need(self.scale_to_zero_grace_s >= 0, "scale_to_zero_grace_s", ">= 0")
        need(self.tick_s > 0, "tick_s", "> 0")
        need(self.min_scale >= 0, "min_scale", ">= 0")
        if self.max_scale is not None:
            need(self.max_scale >= max(1, self.min_scale), "max_scale", ">= max(1, min_scale)")
        # A panic window shorter than a tick could hold no sample at all.
        need(
            self.panic_window_s >= self.tick_s - _EPS,
            "panic_window_fraction",
            f"large enough that the panic window (stable_window_s x fraction) is at least "
            f"tick_s={self.tick_s}",
        )

    def _need(self, ok: bool, name: str, rule: str) -> None:
        # (a method, not nested in __post_init__: mypyc cannot compile that)
        if not ok:
            raise ValueError(f"KpaConfig.{name} must be {rule}, got {getattr(self, name)!r}")

    # Cached (the config is frozen): decide reads these every tick.
    @functools.cached_property
    def panic_window_s(self) -> float:
        """Length of the panic window in seconds."""
        return self.stable_window_s * self.panic_window_fraction

    @functools.cached_property
    def target_per_instance(self) -> float:
        """Concurrency one instance is scaled for (target x utilization)."""
        return self.target_concurrency * self.target_utilization

    @classmethod
    def knative_baseline(cls, target_concurrency: float = 100.0, **overrides: Any) -> KpaConfig:
        """Knative Serving's KPA defaults, as modelled by the simulator's
        baseline: 2 s tick, 60 s stable / 6 s panic window, panic at 200%,
        target utilization 0.7, scale-to-zero grace 30 s, max scale-up rate
        1000, max scale-down rate 2 (``container-concurrency-target-default``
        is 100)."""
        knative = dict(target_utilization=0.7, stable_window_s=60.0, panic_window_fraction=0.1)
        knative.update(panic_threshold=2.0, max_scale_up_rate=1000.0, max_scale_down_rate=2.0)
        knative.update(scale_to_zero_grace_s=30.0, tick_s=2.0)
        return cls(target_concurrency, **{**knative, **overrides})


class ScaleDecision(NamedTuple):
    """What the autoscaler wants for one function at one tick.

    ``desired`` is the total instance count wanted; ``to_start`` and
    ``to_remove`` say how to get there from the counts passed to ``decide``:
    pending starts count toward ``desired``, only ready instances are
    removed (down to ``desired``), and starts under way are never cancelled.
    ``reason`` says why in words.

    (A named tuple, not a frozen dataclass: one is made every tick for
    every function, and a tuple is made several times faster.)"""

    desired: int
    panic: bool
    #: ``reason`` is ``reason_format.format(*reason_args)``, formatted when
    #: read: decisions are made every tick for every function, formatting
    #: is a large part of a decision's cost, and most reasons are never read.
    reason_format: str
    to_start: int = 0
    to_remove: int = 0
    #: average concurrency over the stable and the panic window
    stable_concurrency: float = 0.0
    panic_concurrency: float = 0.0
    reason_args: tuple[Any, ...] = ()

    @property
    def reason(self) -> str:
        """Why this decision, e.g. "stable: 3.50 concurrent over 60s wants 4"."""
        return self.reason_format.format(*self.reason_args)


def window_at_least_a_tick(
    stable_window_s: float, panic_fraction: float, tick_s: float
) -> tuple[float, float]:
    """The stable window and panic fraction a KPA can run with: each window
    at least one autoscaler tick. A window shorter than a tick holds no sample
    (``KpaConfig`` refuses it), and a valid spec must not meet that: Knative's
    6 s minimum stable window with the default 10% gives a 0.6 s panic window
    against Dispatch's 2 s tick. So the windows are raised to one tick (the
    same rounding up Knative's bucketed averages make) instead."""
    stable = max(stable_window_s, tick_s)
    return stable, min(1.0, max(panic_fraction, tick_s / stable))


def function_kpa(
    settings: AutoscaleSettings, spec: common_pb2.FunctionSpec
) -> tuple[KpaConfig, str, dict[str, Any]]:
    """One function's KPA parameters and keep-alive policy (its name and
    options for ``make_keepalive``): the spec's autoscaling fields win, and
    zero means "the Dispatch-wide setting". Dispatch and the simulator both
    merge them here."""
    s, a = settings, spec.autoscaling
    stable_s, fraction = window_at_least_a_tick(
        a.stable_window_ms / 1000.0 or s.stable_window_s,
        a.panic_window_percent / 100.0 or PANIC_WINDOW_FRACTION,
        s.tick_s,
    )
    cfg = KpaConfig(
        target_concurrency=float(spec.concurrency or 1),
        target_utilization=a.target_utilization or s.target_utilization,
        stable_window_s=stable_s,
        panic_window_fraction=fraction,
        scale_to_zero_grace_s=a.scale_to_zero_grace_ms / 1000.0 or s.scale_to_zero_grace_s,
        min_scale=spec.min_scale,
        max_scale=spec.max_scale or None,
        tick_s=s.tick_s,
    )
    # keepalive_ms alone means a fixed keep-alive of that length.
    policy = a.keepalive or ("fixed" if a.keepalive_ms else s.keepalive)
    keep_s = a.keepalive_ms / 1000.0 or s.keepalive_s
    opts: dict[str, Any] = {"seconds": keep_s} if policy == "fixed" else {}
    return cfg, policy, opts
