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

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.runtime.compiled import mypyc_attr
from functions.dispatch.autoscaling.keepalive import FixedKeepAlive, KeepAlivePolicy

# (Re-exported: defined here first; the parameters live in their own module.)
from functions.dispatch.autoscaling.kpaconfig import (
    _EPS,
    _EXACT_SUM,
    KpaConfig,
    ScaleDecision,
    _instances_for,
)

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
