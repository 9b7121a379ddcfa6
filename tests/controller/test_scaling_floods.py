"""The controller follows a flood: scale-out sized to the load in one step,
and every kind that needs instances decided in the same round."""

from __future__ import annotations

import pytest

from controlplane.controller.scaling import (
    KindLimits,
    KindLoad,
    ScalingConfig,
    ScalingContext,
    ScalingState,
    decide_all,
)

LIMITS = {k: KindLimits(100.0, 1, 64) for k in ("dispatch", "schedule", "clustermgr")}


def test_one_step_to_what_the_load_needs() -> None:
    cfg = ScalingConfig(limits=LIMITS)
    assert cfg.max_step_out is None  # the default: no bound
    # 2,000 Schedule requests/s on 4 instances of T = 100: 2000 / (0.6 * 100) = 34.
    ctx = ScalingContext(10.0, {"schedule": KindLoad(4, 2000.0)}, cfg)
    ds, _ = decide_all(ctx, ScalingState())
    assert [(d.kind, d.current, d.desired) for d in ds] == [("schedule", 4, 34)]


def test_a_bound_still_applies_when_set() -> None:
    cfg = ScalingConfig(limits=LIMITS, max_step_out=4)
    ctx = ScalingContext(10.0, {"schedule": KindLoad(4, 2000.0)}, cfg)
    ds, _ = decide_all(ctx, ScalingState())
    assert ds[0].desired == 8
    with pytest.raises(ValueError, match="max_step_out"):
        ScalingConfig(limits=LIMITS, max_step_out=0)


def test_every_overloaded_kind_in_one_round_and_none_twice() -> None:
    cfg = ScalingConfig(limits=LIMITS)
    loads = {
        "dispatch": KindLoad(2, 600.0),
        "schedule": KindLoad(4, 2000.0),
        "clustermgr": KindLoad(1, 10.0),  # idle: nothing to do
    }
    ds, state = decide_all(ScalingContext(10.0, loads, cfg), ScalingState())
    assert sorted((d.kind, d.desired) for d in ds) == [("dispatch", 10), ("schedule", 34)]
    # The next round, before the instances arrive: both are pending.
    again, _ = decide_all(ScalingContext(11.0, loads, cfg), state)
    assert again == []
