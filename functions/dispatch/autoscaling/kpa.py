"""Function-instance autoscaling in the style of the Knative Pod Autoscaler (KPA).

Pure: no I/O, no asyncio, no clock reads; the caller passes ``now`` (from an
injected ``controlplane.runtime.clock.Clock``), so the Dispatch service and the
simulator run the same code tick by tick. One ``KpaAutoscaler`` per function.

Each tick the caller reports the function's concurrency (requests in flight
plus queued) with ``observe`` and asks ``decide`` for the desired number of
instances. The rules, and where they come from (Knative Serving
documentation, "Configuring the autoscaler" / "Additional autoscaling
configuration for Knative Pod Autoscaler", and its ``config-autoscaler``
defaults):

* **Target.** desired = ceil(average concurrency / (target_concurrency x
  target_utilization)); Knative: pods = concurrent requests / (container
  concurrency x target utilization), e.g. 100 / (10 x 0.7) -> 15.
* **Stable window** (default 60 s): the average over the last stable window
  drives normal scaling.
* **Panic window** = stable window x panic_window_fraction (default 10%, i.e. 6 s). When the
  panic-window desired count is >= panic_threshold (default 200%) x the ready instances, the
  autoscaler enters panic mode and follows the panic window. In panic it never scales down ("to
  avoid churn") and it leaves panic only after a whole stable window without a reason to panic.
* **Rate limits**: at most ceil(ready x max_scale_up_rate) (default 1000) and at least floor(ready
  / max_scale_down_rate) (default 2) per decision, with ready counted as at least 1 so a function
  at zero can start.
* **Bounds**: min_scale and max_scale clamp the result.
* **Scale to zero**: the last instance goes only when (1) there was no traffic for the entire
  stable window (Knative: "the last Replica will only be removed after there has not been any
  traffic to the Revision for the entire duration of the stable window"), (2) the function has been
  idle for scale_to_zero_grace_s (default 30 s) and (3) the keep-alive policy agrees
  (``functions.dispatch.autoscaling.keepalive``; it may also ask to pre-warm one instance ahead of
  a predicted request). In Knative the grace period is an upper bound on waiting for the activator
  to be in the request path; here it is a minimum idle time, which with the default windows (60 s >
  30 s) makes no difference: rule (1) binds first.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from controlplane.runtime.compiled import mypyc_attr
from functions.dispatch.autoscaling.keepalive import FixedKeepAlive, KeepAlivePolicy

# (Re-exported: they were defined here first.)
from functions.dispatch.autoscaling.removal import (
    InstanceView,
    RemovalCandidate,
    idle_instances_to_remove,
)

__all__ = [
    "InstanceView",
    "KpaAutoscaler",
    "KpaConfig",
    "RemovalCandidate",
    "ScaleDecision",
    "idle_instances_to_remove",
]

# Float slack: 2.1 concurrent / (3 x 0.7) is 1.0000000000000002 in floats and
# must give 1 instance, not 2.
_EPS = 1e-9
# Sums of non-negative whole numbers below 2**53 are exact in floats, in any
# order: up to there a running sum of whole-number samples equals the sum
# taken afresh, bit for bit.
_EXACT_SUM = 2**53


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
    target_utilization: float = 1.0
    stable_window_s: float = 60.0
    #: panic window = stable_window_s x this (Knative: panic-window-percentage 10%)
    panic_window_fraction: float = 0.1
    #: panic when panic desired >= this x ready (Knative: 200%)
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    min_scale: int = 0
    #: None = no upper bound
    max_scale: int | None = None
    #: how often the caller is expected to observe and decide (Knative: 2 s)
    tick_s: float = 2.0

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


#: a reason, unformatted: (str.format template, its arguments...)
_Why = tuple[Any, ...]


@mypyc_attr(allow_interpreted_subclasses=True)  # (tests subclass it)
class KpaAutoscaler:
    """KPA-style autoscaler state of one function; drive it tick by tick.

    ``keepalive`` decides, together with the grace period, when the last
    instance may go (default ``FixedKeepAlive(0)``: the grace period alone).
    """

    def __init__(self, config: KpaConfig, keepalive: KeepAlivePolicy | None = None) -> None:
        self.config = config
        self.keepalive: KeepAlivePolicy = keepalive if keepalive is not None else FixedKeepAlive(0)
        self._samples: deque[tuple[float, float]] = deque()
        #: sum of the whole-number samples in ``_samples`` (a Python int:
        #: exact), and how many samples are not whole numbers
        self._whole_sum = 0
        self._fractional = 0
        self._last_t: float | None = None
        #: when the current idle period began (None while busy)
        self._idle_since: float | None = None
        #: whether the keep-alive policy was told about the current idle period
        self._idle_told = False
        #: time of the latest sample with traffic (None: no traffic seen yet)
        self._last_busy: float | None = None
        self._panic_since: float | None = None  # last time the panic condition held
        self._max_panic = 0
        #: (base, config, up_cap, down_floor) of the last decision (``decide``)
        self._limits: tuple[int, KpaConfig | None, int, int] = (0, None, 0, 0)
        #: how many of the latest samples equal the latest one (those of them
        #: still in ``_samples``, which pruning shortens from the front)
        self._tail_run = 0
        #: ((stable_c, panic_c, ready, pending, config), decision) of the last
        #: ``decide`` when its inputs alone made it (see ``decide``), else None
        self._memo: tuple[tuple[Any, ...], ScaleDecision] | None = None

    # -- inputs -------------------------------------------------------------

    def observe(self, now: float, concurrency: float, *, last_active: float | None = None) -> None:
        """Record the function's concurrency at ``now``: requests in flight plus
        queued. Best is the average over the tick (as Knative's queue-proxy
        reports); an instantaneous count misses requests shorter than a tick.

        ``last_active`` (e.g. ``FunctionRouter.last_active``: the last grant
        or release) lets a request that began and ended between two samples
        count as activity, so the idle clock restarts."""
        if not math.isfinite(concurrency) or concurrency < 0:
            raise ValueError(f"concurrency must be a finite number >= 0, got {concurrency!r}")
        # _advance and _prune, inline: observe runs every tick for every
        # function (the simulator's 8-hour traces: millions of times)
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite time, got {now!r}")
        if self._last_t is not None and now < self._last_t:
            raise ValueError(f"time went backward: {now} < {self._last_t}")
        self._last_t = now
        c = float(concurrency)
        samples = self._samples
        if samples and samples[-1][1] == c:
            self._tail_run += 1
        else:
            self._tail_run = 1
        samples.append((now, c))
        if c.is_integer():
            self._whole_sum += int(c)
        else:
            self._fractional += 1
        cutoff = now - self.config.stable_window_s + _EPS
        while samples and samples[0][0] < cutoff:
            old = samples.popleft()[1]
            if old.is_integer():
                self._whole_sum -= int(old)
            else:
                self._fractional -= 1
        idle_since = self._idle_since
        # A grant or release after the idle start: activity between samples.
        between = (
            last_active
            if last_active is not None
            and idle_since is not None
            and idle_since < last_active <= now
            else None
        )
        if concurrency > 0:
            if idle_since is not None and self._idle_told:
                # First request after an idle period; a grant since the last
                # sample dates it more precisely than this sample does.
                self.keepalive.on_invocation(now if between is None else between)
            self._idle_since, self._idle_told = None, False
            self._last_busy = now
            return
        if idle_since is None:
            if self._last_busy is None:
                # No traffic seen yet: idle for the grace period, but there is
                # no idle time between invocations to teach the keep-alive.
                self._idle_since = now
                return
            # Busy -> idle: the last release, when known, is the exact end.
            end = now
            if last_active is not None and self._last_busy <= last_active <= now:
                end = last_active
            self._start_idle(end)
        elif between is not None:
            # A request began and ended between two samples.
            if self._idle_told:
                self.keepalive.on_invocation(between)
            self._start_idle(between)

    def decide(self, now: float, ready_instances: int, pending: int = 0) -> ScaleDecision:
        """The desired instance count at ``now``, given ``ready_instances``
        serving (not draining) and ``pending`` starts under way."""
        if ready_instances < 0 or pending < 0:
            raise ValueError(
                f"ready_instances and pending must be >= 0, got {ready_instances}, {pending}"
            )
        cfg = self.config
        if now != self._last_t:
            # (At the time of the last observe, as per tick, both were just
            # done: the clock checked and the window pruned to now.)
            self._advance(now)
            self._prune(now)
        if not self._samples:
            hold = self._clamp(ready_instances)
            return self._decision(
                hold, ready_instances, pending, ("no samples yet: hold",), 0.0, 0.0
            )
        samples = self._samples
        n = len(samples)
        if self._fractional or self._whole_sum >= _EXACT_SUM:
            stable_c = self._average(now, cfg.stable_window_s)
        else:  # _stable_average, inline
            stable_c = float(self._whole_sum) / n
        # The panic window is the latest few samples; when they all equal the
        # latest one, v, a whole number, their sum is exactly k * v and the
        # average v (+ 0.0: the sum of zeros starting from 0.0 is never -0.0),
        # what ``_average`` gives without walking them.
        run = self._tail_run
        last_t, v = samples[-1]
        cut = now - cfg.panic_window_s + _EPS
        if (
            last_t >= cut
            and v.is_integer()
            and (run >= n or samples[-run - 1][0] < cut)
            and v * n < _EXACT_SUM
        ):
            panic_c = v + 0.0
        else:
            panic_c = self._average(now, cfg.panic_window_s)
        # The same inputs as the last decision, which they alone made (not in
        # panic, not through the zero gate, whose rules read the time): the
        # same decision, and nothing below would change any state.
        key = (stable_c, panic_c, ready_instances, pending, cfg)
        memo = self._memo
        if memo is not None and memo[0] == key and self._panic_since is None:
            return memo[1]
        self._memo = None
        # (_instances_for is 0 without traffic: skip the call in that case)
        per = cfg.target_per_instance
        want_stable = _instances_for(stable_c, per) if stable_c > 0 else 0
        want_panic = _instances_for(panic_c, per) if panic_c > 0 else 0

        # Rate limits, with ready counted as at least 1 (Knative does the same)
        # so scaling from zero is possible.
        # (Conditional expressions for max and min, and the limits kept for
        # the last ``base``, which seldom changes: decide runs every tick.)
        base = ready_instances if ready_instances > 1 else 1
        limits = self._limits
        if base != limits[0] or cfg is not limits[1]:
            up = math.ceil(base * cfg.max_scale_up_rate - _EPS)
            down = math.floor(base / cfg.max_scale_down_rate + _EPS)
            limits = self._limits = (base, cfg, up, down)
        up_cap, down_floor = limits[2], limits[3]
        stable_n = want_stable if want_stable > down_floor else down_floor
        stable_n = stable_n if stable_n < up_cap else up_cap
        panic_n = want_panic if want_panic > down_floor else down_floor
        panic_n = panic_n if panic_n < up_cap else up_cap

        over = want_panic / base >= cfg.panic_threshold
        if over:
            if self._panic_since is None:
                self._max_panic = ready_instances
            self._panic_since = now  # each new reason to panic extends the panic
        elif self._panic_since is not None and now - self._panic_since >= cfg.stable_window_s:
            self._panic_since = None  # a whole stable window without a reason to panic
            self._max_panic = 0

        if self._panic_since is not None:
            # Panic: follow the short window, never scale down.
            self._max_panic = max(self._max_panic, panic_n, ready_instances)
            desired = self._max_panic
            why: _Why = (
                "panic: {:.2f} concurrent over {:g}s wants {} (ready {})",
                panic_c, cfg.panic_window_s, want_panic, ready_instances,
            )  # fmt: skip
        else:
            desired = stable_n
            why = ("stable: {:.2f} concurrent over {:g}s wants {}", stable_c,
                   cfg.stable_window_s, want_stable)  # fmt: skip
            if stable_n != want_stable:
                why = (why[0] + ", rate-limited to {}", *why[1:], stable_n)
            if desired == 0:
                desired, why = self._zero_gate(now, ready_instances + pending)

        # _clamp, inline (every tick of every function)
        clamped = desired if desired >= cfg.min_scale else cfg.min_scale
        if cfg.max_scale is not None and clamped > cfg.max_scale:
            clamped = cfg.max_scale
        if clamped != desired:
            why = (why[0] + "; clamped to [{}, {}] -> {}", *why[1:],
                   cfg.min_scale, cfg.max_scale, clamped)  # fmt: skip
        d = self._decision(clamped, ready_instances, pending, why, stable_c, panic_c)
        if stable_n and not over and self._panic_since is None:
            self._memo = (key, d)
        return d

    # -- state, for callers and tests --------------------------------------

    @property
    def in_panic(self) -> bool:
        """Whether the autoscaler is in panic mode."""
        return self._panic_since is not None

    @property
    def idle_since(self) -> float | None:
        """Start of the current idle period (None while the function is busy)."""
        return self._idle_since

    def hold_until(self, now: float, ready_instances: int, pending: int = 0) -> float:
        """For a caller that skips idle rounds: called after ``observe(now, 0,
        last_active=a)`` and ``decide(now, ready_instances, pending)``, a
        time before which ``decide`` at later times gives the same desired
        count and panic flag -- provided each of those times first gets
        ``observe(t, 0, last_active=a)`` (no traffic, the same last activity)
        and ready and pending stay -- while those observes and decides
        change no state but the samples. That is the zero gate's hold: the
        stable window holds only zeros and the decision depends on the
        time only through the idle time reaching the grace period, the
        keep-alive or the pre-warm window. ``now`` when no such hold applies."""
        cfg = self.config
        idle_since = self._idle_since
        if (
            self._last_t != now
            or not self._samples
            or self._whole_sum
            or self._fractional
            or self._panic_since is not None
            or idle_since is None
        ):
            return now
        base = ready_instances if ready_instances > 1 else 1
        if math.floor(base / cfg.max_scale_down_rate + _EPS) > 0:
            return now  # not the zero gate: the rate limit keeps instances
        # The zero gate (``_zero_gate``) is a step function of the idle time
        # with steps at these: the hold lasts until the next one.
        prewarm = self.keepalive.prewarm_s(now)
        keep = self.keepalive.keep_alive_s(now)
        steps = [cfg.scale_to_zero_grace_s]
        if self._idle_told and prewarm > 0:
            steps += [prewarm, prewarm + keep]
        if prewarm <= 0:
            steps.append(keep)
        idle_for = now - idle_since
        ahead = [x for x in steps if x > idle_for]
        if not ahead:
            return math.inf
        # (less a margin: ``now - idle_since`` is rounded)
        end = idle_since + min(ahead) - 1e-6
        return end if end > now else now

    def next_prewarm_at(self, now: float) -> float | None:
        """When the keep-alive policy wants an instance back if the function
        stays idle: a time >= now (now when already due), or None when no
        pre-warm is ahead. A caller that stops ticking an idle function at
        zero must tick it again by then."""
        if self._idle_since is None or not self._idle_told:
            return None
        prewarm = self.keepalive.prewarm_s(now)
        start = self._idle_since + prewarm
        end = start + self.keepalive.keep_alive_s(now)
        return max(start, now) if prewarm > 0 and now < end else None

    def instances_to_remove(
        self,
        decision: ScaleDecision,
        instances: Iterable[RemovalCandidate],
        idle_since: Mapping[str, float] | None = None,
    ) -> list[str]:
        """Which instances to drain for ``decision.to_remove`` (see
        ``idle_instances_to_remove``)."""
        return idle_instances_to_remove(instances, decision.to_remove, idle_since)

    # -- internals ----------------------------------------------------------

    def _start_idle(self, at: float) -> None:
        self._idle_since, self._idle_told = at, True
        self.keepalive.on_idle_start(at)

    def _zero_gate(self, now: float, have: int) -> tuple[int, _Why]:
        """Desired count when the stable window wants zero instances."""
        cfg = self.config
        idle_for = 0.0 if self._idle_since is None else now - self._idle_since
        prewarm = self.keepalive.prewarm_s(now)
        keep = self.keepalive.keep_alive_s(now)
        if self._idle_told and prewarm > 0 and prewarm <= idle_for < prewarm + keep:
            return 1, (
                "pre-warm: idle {:.0f}s, keep-alive policy wants an instance from {:.0f}s to "
                "{:.0f}s",
                idle_for, prewarm, prewarm + keep,
            )  # fmt: skip
        if have == 0:
            return 0, ("at zero: idle {:.0f}s", idle_for)
        if idle_for < cfg.scale_to_zero_grace_s:
            return 1, ("grace: idle {:.0f}s < {:g}s", idle_for, cfg.scale_to_zero_grace_s)
        if prewarm <= 0 and idle_for < keep:
            return 1, ("keep-alive: idle {:.0f}s < {:.0f}s", idle_for, keep)
        return 0, ("scale to zero: idle {:.0f}s", idle_for)

    def _advance(self, now: float) -> None:
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite time, got {now!r}")
        if self._last_t is not None and now < self._last_t:
            raise ValueError(f"time went backward: {now} < {self._last_t}")
        self._last_t = now

    def _prune(self, now: float) -> None:
        cutoff = now - self.config.stable_window_s + _EPS
        samples = self._samples
        while samples and samples[0][0] < cutoff:
            c = samples.popleft()[1]
            if c.is_integer():
                self._whole_sum -= int(c)
            else:
                self._fractional -= 1

    def _stable_average(self, now: float) -> float:
        """``_average`` over the stable window, which after ``_prune(now)``
        holds every sample: from the running sum when that is exact (whole
        numbers), else summed afresh."""
        if self._fractional or self._whole_sum >= _EXACT_SUM:
            return self._average(now, self.config.stable_window_s)
        n = len(self._samples)
        return float(self._whole_sum) / n if n else 0.0

    def _average(self, now: float, window: float) -> float:
        """Mean of the samples taken in (now - window, now]. With samples at a
        regular tick this is the time average Knative uses; with less history
        than the window, the average over what there is."""
        cutoff = now - window + _EPS
        total, n = 0.0, 0
        for t, c in reversed(self._samples):
            if t < cutoff:
                break
            total += c
            n += 1
        return total / n if n else 0.0

    def _clamp(self, n: int) -> int:
        cfg = self.config
        n = max(n, cfg.min_scale)
        return n if cfg.max_scale is None else min(n, cfg.max_scale)

    def _decision(
        self, desired: int, ready: int, pending: int, why: _Why, stable_c: float, panic_c: float
    ) -> ScaleDecision:
        # Pending starts count toward desired. They are not cancelled (a start
        # cannot be recalled); if they land surplus, a later tick removes them.
        start, remove = desired - ready - pending, ready - desired
        # tuple.__new__: the named tuple without its generated Python __new__
        # (one decision per function per tick)
        return tuple.__new__(
            ScaleDecision,
            (
                desired,
                self._panic_since is not None,
                why[0],
                start if start > 0 else 0,
                remove if remove > 0 else 0,
                stable_c,
                panic_c,
                why[1:],
            ),
        )
