"""The sleeping-instance policy: scale-in sleeps before it removes, scale-out
wakes before it cold-starts, a long sleep ends in removal (injected clock)."""

from __future__ import annotations

import pytest

from controlplane.runtime.sleeppolicy import SleepPolicy, Step


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_scale_in_sleeps_up_to_the_bound_then_removes() -> None:
    p = SleepPolicy(keep_asleep_s=60, max_asleep=2, clock=Clock())
    assert [p.scale_in(i) for i in ("a", "b", "c")] == [Step.SLEEP, Step.SLEEP, Step.REMOVE]
    assert list(p.asleep) == ["a", "b"]
    with pytest.raises(ValueError, match="already asleep"):
        p.scale_in("a")


def test_scale_out_wakes_the_most_recently_asleep_first() -> None:
    clock = Clock()
    p = SleepPolicy(keep_asleep_s=60, max_asleep=3, clock=clock)
    for i in ("a", "b", "c"):
        p.scale_in(i)
        clock.t += 1
    assert p.wake(2) == ["c", "b"]
    assert p.wake(5) == ["a"]
    assert p.wake(1) == [] and p.wake(-1) == []


def test_an_instance_asleep_too_long_is_removed_and_a_gone_one_forgotten() -> None:
    clock = Clock()
    p = SleepPolicy(keep_asleep_s=60, max_asleep=3, clock=clock)
    p.scale_in("a")
    clock.t += 30
    p.scale_in("b")
    p.scale_in("c")
    assert p.expired() == []
    clock.t += 30
    assert p.expired() == ["a"]
    p.forget("b")
    clock.t += 30
    assert p.expired() == ["c"] and not p.asleep


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_asleep"):
        SleepPolicy(max_asleep=-1)


def test_an_instance_found_asleep_expires_from_when_it_fell_asleep() -> None:
    # A restarted owner finds it asleep for 50 s already: 10 s more, not 60.
    clock = Clock()
    p = SleepPolicy(keep_asleep_s=60, max_asleep=2, clock=clock)
    assert p.scale_in("old", asleep_s=50.0) is Step.SLEEP
    assert p.scale_in("new") is Step.SLEEP
    clock.t += 10.0
    assert p.expired() == ["old"]
    with pytest.raises(ValueError, match="asleep_s"):
        p.scale_in("x", asleep_s=-1.0)
