"""``KpaAutoscaler.hold_until``: until the time it gives, rounds without
traffic decide what the round it was asked after decided (desired count,
panic flag, starts and removals) and change no state but the samples."""

from __future__ import annotations

import copy
import random

import pytest

from functions.dispatch.autoscaling import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.keepalive import FixedKeepAlive, HybridHistogramKeepAlive

CONFIGS = [
    KpaConfig(target_concurrency=1, max_scale=100),
    KpaConfig(target_concurrency=3, min_scale=1, max_scale=4),
    KpaConfig(target_concurrency=2, scale_to_zero_grace_s=45.0),
    KpaConfig.knative_baseline(10.0),
]


def _state(k: KpaAutoscaler) -> tuple[object, ...]:
    return (k._idle_since, k._idle_told, k._last_busy, k._panic_since, k._max_panic)


def _keepalive(rng: random.Random) -> FixedKeepAlive | HybridHistogramKeepAlive:
    if rng.random() < 0.4:
        return FixedKeepAlive(rng.choice([0.0, 10.0, 40.0, 90.0]))
    h = HybridHistogramKeepAlive(bin_s=5.0, range_s=300.0, min_samples=2)
    if rng.random() < 0.7:
        # A history of regular idle times: a pre-warm window (prewarm > 0).
        for _ in range(10):
            h.record_idle_time(rng.choice([40.0, 60.0, 120.0]))
        assert h.prewarm_s(0.0) > 0
    return h


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("cfg", CONFIGS)
def test_rounds_before_the_hold_ends_decide_the_same(seed, cfg):
    rng = random.Random(seed)
    kpa = KpaAutoscaler(cfg, _keepalive(rng))
    now, ready, pending, last = 0.0, 0, 0, 0.0
    held, active = 0, True
    for _ in range(600):
        now += 2.0
        if rng.random() < 0.04:
            active = not active  # busy and quiet spells
        busy = active and rng.random() < 0.3
        if rng.random() < (0.2 if active else 0.02):
            last = now - rng.random() * 2.0  # a request between two samples
        load = rng.choice([1, 2, 5]) if busy else 0
        kpa.observe(now, load, last_active=last or None)
        d = kpa.decide(now, ready, pending)
        until = kpa.hold_until(now, ready, pending)
        assert until >= now
        if until > now:
            assert load == 0
            held += 1
            # The rounds the hold covers, on a copy: the same decision.
            twin, t = copy.deepcopy(kpa), now
            before = _state(twin)
            while True:
                t += rng.choice([0.5, 2.0, 2.0, 7.0])
                if t >= until or t > now + 400:
                    break
                twin.observe(t, 0, last_active=last or None)
                e = twin.decide(t, ready, pending)
                assert (e.desired, e.panic, e.to_start, e.to_remove) == (
                    d.desired,
                    d.panic,
                    d.to_start,
                    d.to_remove,
                )
                assert _state(twin) == before
        ready = max(0, min(d.desired + rng.choice([-1, 0, 0, 1]), 50))
        pending = rng.choice([0, 0, 0, 1])
    assert held > 0


def test_no_hold_with_traffic_in_the_window_or_in_panic():
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1), FixedKeepAlive(0.0))
    kpa.observe(2.0, 3)
    kpa.decide(2.0, 1)
    assert kpa.hold_until(2.0, 1) == 2.0  # busy
    kpa.observe(4.0, 0)
    kpa.decide(4.0, 3)
    assert kpa.hold_until(4.0, 3) == 4.0  # the window still holds traffic


def test_the_hold_ends_at_the_grace_period():
    cfg = KpaConfig(target_concurrency=1, stable_window_s=20.0, scale_to_zero_grace_s=30.0)
    kpa = KpaAutoscaler(cfg, FixedKeepAlive(0.0))
    kpa.observe(0.0, 1)
    t = 2.0
    while True:
        kpa.observe(t, 0)
        d = kpa.decide(t, 1)
        if kpa.hold_until(t, 1) > t:
            break
        t += 2.0
    assert d.desired == 1  # held through the grace period
    until = kpa.hold_until(t, 1)
    assert 31.9 < until < 32.0  # idle since 2 s, grace 30 s
    kpa.observe(32.0, 0)
    assert kpa.decide(32.0, 1).desired == 0


def test_the_hold_ends_where_the_keepalive_wants_an_instance_back():
    """With a pre-warm window ahead (the hybrid keep-alive after regular
    idle times of 120 s), a hold at zero ends when the window opens."""
    keep = HybridHistogramKeepAlive(bin_s=5.0, range_s=300.0, min_samples=2)
    for _ in range(10):
        keep.record_idle_time(120.0)
    prewarm = keep.prewarm_s(0.0)
    assert prewarm > 60.0
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1), keep)
    kpa.observe(0.0, 1)
    kpa.decide(0.0, 1)
    t, held = 0.0, []
    while t < prewarm + 20.0:
        t += 2.0
        kpa.observe(t, 0)
        d = kpa.decide(t, 0)  # scaled to zero already
        until = kpa.hold_until(t, 0)
        if until > t:
            held.append((t, d.desired, until))
    idle_since = 2.0
    before = [(t, until) for t, desired, until in held if desired == 0]
    assert before and all(until <= idle_since + prewarm for _, until in before)
    after = [desired for t, desired, _ in held if t > idle_since + prewarm]
    assert after and set(after) == {1}
