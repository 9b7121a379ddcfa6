"""KPA fast paths: the running stable-window sum and the lazily formatted
reason give exactly what summing afresh and formatting at once give."""

import random

import pytest

from functions.dispatch.autoscaling import KpaAutoscaler, KpaConfig, ScaleDecision


def fresh_sum_check(kpa: KpaAutoscaler, now: float) -> None:
    """The running sums equal the samples, and the stable average equals
    the plain re-summed average bit for bit."""
    samples = [c for _, c in kpa._samples]
    whole = [c for c in samples if c.is_integer()]
    assert kpa._whole_sum == sum(int(c) for c in whole)
    assert kpa._fractional == len(samples) - len(whole)
    assert kpa._stable_average(now) == kpa._average(now, kpa.config.stable_window_s)


@pytest.mark.parametrize("seed", range(20))
def test_running_stable_sum_equals_the_sum_taken_afresh(seed):
    rng = random.Random(seed)
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=rng.choice([1, 3, 10])))
    now, ready = 0.0, 0
    for _ in range(3000):
        # Irregular ticks, idle stretches, whole numbers mostly (as the
        # simulator reports), now and then a fractional tick average.
        now += rng.choice([0.5, 1.0, 2.0, 2.0, 2.0, 7.0, 61.0])
        load = rng.choice([0, 0, 1, 2, 5, 40, 1000])
        if rng.random() < 0.05:
            load = load + rng.random()
        kpa.observe(now, load)
        d = kpa.decide(now, ready, rng.choice([0, 0, 1]))
        fresh_sum_check(kpa, now)
        ready = d.desired


def test_huge_whole_numbers_fall_back_to_summing_afresh():
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1.0))
    for k in range(1, 5):
        kpa.observe(2.0 * k, float(2**52 + k))  # the sum leaves exact floats
        kpa.decide(2.0 * k, 1)
        fresh_sum_check(kpa, 2.0 * k)


def test_reason_text_is_formatted_when_read():
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=2.0, max_scale=3))
    kpa.observe(2.0, 3)
    d = kpa.decide(2.0, 2)
    assert d.reason == "stable: 3.00 concurrent over 60s wants 2"
    kpa.observe(4.0, 40)
    d = kpa.decide(4.0, 2)
    assert d.reason == (
        "panic: 21.50 concurrent over 6s wants 11 (ready 2); clamped to [0, 3] -> 3"
    )
    assert (d.desired, d.panic, d.to_start) == (3, True, 1)


def test_decisions_are_immutable_values():
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1.0))
    kpa.observe(2.0, 1)
    d = kpa.decide(2.0, 1)
    with pytest.raises(AttributeError):
        d.desired = 5  # type: ignore[misc]
    assert d == ScaleDecision(*d) and isinstance(d.reason, str)
