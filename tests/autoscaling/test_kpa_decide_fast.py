"""``KpaAutoscaler`` fast paths (observe's clock check and prune inline; in
decide no second clock check and prune at the time of the last observe, the
stable average and clamp inline, limits kept for the last ready count,
max/min written out, the decision made with tuple.__new__) decide exactly
what the straightforward version below decides, reasons and state included."""

from __future__ import annotations

import math
import random

import pytest

from functions.dispatch.autoscaling import KpaAutoscaler, KpaConfig, ScaleDecision
from functions.dispatch.autoscaling.keepalive import FixedKeepAlive
from functions.dispatch.autoscaling.kpa import _EPS, _instances_for


class PlainKpa(KpaAutoscaler):
    """observe and decide as first written."""

    def observe(self, now: float, concurrency: float, *, last_active: float | None = None) -> None:
        if not math.isfinite(concurrency) or concurrency < 0:
            raise ValueError("bad concurrency")
        self._advance(now)
        c = float(concurrency)
        self._samples.append((now, c))
        if c.is_integer():
            self._whole_sum += int(c)
        else:
            self._fractional += 1
        self._prune(now)
        idle_since = self._idle_since
        between = (
            last_active
            if last_active is not None
            and idle_since is not None
            and idle_since < last_active <= now
            else None
        )
        if concurrency > 0:
            if idle_since is not None and self._idle_told:
                self.keepalive.on_invocation(now if between is None else between)
            self._idle_since, self._idle_told = None, False
            self._last_busy = now
            return
        if idle_since is None:
            if self._last_busy is None:
                self._idle_since = now
                return
            end = now
            if last_active is not None and self._last_busy <= last_active <= now:
                end = last_active
            self._start_idle(end)
        elif between is not None:
            if self._idle_told:
                self.keepalive.on_invocation(between)
            self._start_idle(between)

    def decide(self, now: float, ready_instances: int, pending: int = 0) -> ScaleDecision:
        if ready_instances < 0 or pending < 0:
            raise ValueError("negative")
        cfg = self.config
        self._advance(now)
        self._prune(now)
        if not self._samples:
            hold = self._clamp(ready_instances)
            return self._plain_decision(
                hold, ready_instances, pending, ("no samples yet: hold",), 0.0, 0.0
            )
        stable_c = self._stable_average(now)
        panic_c = self._average(now, cfg.panic_window_s)
        want_stable = _instances_for(stable_c, cfg.target_per_instance)
        want_panic = _instances_for(panic_c, cfg.target_per_instance)
        base = max(1, ready_instances)
        up_cap = math.ceil(base * cfg.max_scale_up_rate - _EPS)
        down_floor = math.floor(base / cfg.max_scale_down_rate + _EPS)
        stable_n = min(max(want_stable, down_floor), up_cap)
        panic_n = min(max(want_panic, down_floor), up_cap)
        over = want_panic / base >= cfg.panic_threshold
        if over:
            if self._panic_since is None:
                self._max_panic = ready_instances
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= cfg.stable_window_s:
            self._panic_since = None
            self._max_panic = 0
        if self._panic_since is not None:
            self._max_panic = max(self._max_panic, panic_n, ready_instances)
            desired = self._max_panic
            why: tuple[object, ...] = (
                "panic: {:.2f} concurrent over {:g}s wants {} (ready {})",
                panic_c,
                cfg.panic_window_s,
                want_panic,
                ready_instances,
            )
        else:
            desired = stable_n
            why = (
                "stable: {:.2f} concurrent over {:g}s wants {}",
                stable_c,
                cfg.stable_window_s,
                want_stable,
            )
            if stable_n != want_stable:
                why = (str(why[0]) + ", rate-limited to {}", *why[1:], stable_n)
            if desired == 0:
                desired, why = self._zero_gate(now, ready_instances + pending)
        clamped = self._clamp(desired)
        if clamped != desired:
            why = (
                str(why[0]) + "; clamped to [{}, {}] -> {}",
                *why[1:],
                cfg.min_scale,
                cfg.max_scale,
                clamped,
            )
        return self._plain_decision(clamped, ready_instances, pending, why, stable_c, panic_c)

    def _plain_decision(
        self,
        desired: int,
        ready: int,
        pending: int,
        why: tuple[object, ...],
        stable_c: float,
        panic_c: float,
    ) -> ScaleDecision:
        return ScaleDecision(
            desired,
            self._panic_since is not None,
            str(why[0]),
            max(0, desired - ready - pending),
            max(0, ready - desired),
            stable_c,
            panic_c,
            why[1:],
        )


CONFIGS = [
    KpaConfig(target_concurrency=1, max_scale=100),
    KpaConfig(target_concurrency=3, min_scale=1, max_scale=4),
    KpaConfig(target_concurrency=10, max_scale_up_rate=2.5, max_scale_down_rate=1.5),
    KpaConfig.knative_baseline(10.0),
]


def state(k: KpaAutoscaler) -> tuple[object, ...]:
    return (
        k._last_t,
        k._idle_since,
        k._idle_told,
        k._last_busy,
        k._panic_since,
        k._max_panic,
        k._whole_sum,
        k._fractional,
        list(k._samples),
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cfg", CONFIGS)
def test_decisions_equal_the_plain_decide(seed, cfg):
    compare_with_plain(seed, cfg, sticky=0.0)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("cfg", CONFIGS)
def test_steady_load_decisions_equal_the_plain_decide(seed, cfg):
    """Long runs of one load (the panic average without walking the window,
    and decisions repeated for the same inputs) decide as the plain code."""
    compare_with_plain(seed, cfg, sticky=0.9)


def compare_with_plain(seed: int, cfg: KpaConfig, sticky: float) -> None:
    """Drive the fast and the plain autoscaler alike; the load repeats with
    probability ``sticky``."""
    rng = random.Random(seed)
    fast, plain = KpaAutoscaler(cfg, FixedKeepAlive(20.0)), PlainKpa(cfg, FixedKeepAlive(20.0))
    now, ready, load = 0.0, 0, 0.0
    for _ in range(1500):
        now += rng.choice([0.0, 0.5, 2.0, 2.0, 2.0, 2.0, 9.0, 70.0])
        # Mostly observe-then-decide at one time (as each tick), sometimes a
        # decide alone, a second decide, or a config swapped in.
        if rng.random() < 0.85:
            if rng.random() >= sticky:
                load = rng.choice([0, 0, 0, 1, 2, 3, 8, 30, 200])
                if rng.random() < 0.05:
                    load += rng.random()
            last = now - rng.random() * 3 if rng.random() < 0.5 else None
            fast.observe(now, load, last_active=last)
            plain.observe(now, load, last_active=last)
            assert state(fast) == state(plain)
        if rng.random() < 0.02:
            fast.config = plain.config = rng.choice(CONFIGS)
        pending = rng.choice([0, 0, 0, 1, 3])
        for _ in range(2 if rng.random() < 0.1 else 1):
            a, b = fast.decide(now, ready, pending), plain.decide(now, ready, pending)
            assert a == b and a.reason == b.reason
            assert state(fast) == state(plain)
        ready = max(0, min(a.desired + rng.choice([-1, 0, 0, 0, 1]), 500))


def test_observe_still_checks_the_clock():
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1))
    kpa.observe(2.0, 1)
    for bad in (1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            kpa.observe(bad, 1)
    with pytest.raises(ValueError):
        kpa.observe(3.0, -1)
    assert kpa.decide(2.0, 1).desired == 1
