"""The control function scaling policy, driven by scripted load sequences
with a manual clock: no I/O, no real time."""

from __future__ import annotations

import itertools
import math

import pytest

from controlplane.controller.scaling import (
    KindLimits,
    KindLoad,
    ScalingConfig,
    ScalingContext,
    ScalingState,
    decide,
    needed_instances,
)
from controlplane.runtime.clock import ManualClock

T_SF = 100.0


def config(**kw) -> ScalingConfig:
    limits = kw.pop("limits", None) or {"schedule": KindLimits(T_SF, 1, 6)}
    base = dict(
        target_utilization=0.6,
        high_watermark=0.8,
        low_watermark=0.3,
        scale_out_cooldown_s=2.0,
        scale_in_cooldown_s=10.0,
        max_step_out=4,
        action_timeout_s=30.0,
    )
    base.update(kw)
    return ScalingConfig(limits=limits, **base)


class Driver:
    """Runs the policy once per scripted second; the 'cluster' follows
    decisions after a delay (instances register act_delay ticks later)."""

    def __init__(self, cfg: ScalingConfig, instances: int = 1, act_delay: int = 2) -> None:
        self.cfg = cfg
        self.clock = ManualClock()
        self.state = ScalingState()
        self.instances = instances
        self.act_delay = act_delay
        self.pending: list[tuple[float, int]] = []  # (when it lands, target)
        self.decisions = []

    def step(self, load: float, kind: str = "schedule", busy: bool = False):
        now = self.clock.now()
        for when, target in list(self.pending):
            if now >= when:
                self.instances = target
                self.pending.remove((when, target))
        ctx = ScalingContext(now, {kind: KindLoad(self.instances, load, busy=busy)}, self.cfg)
        d, self.state = decide(ctx, self.state)
        if d is not None:
            self.decisions.append((now, d))
            self.pending.append((now + self.act_delay, d.desired))
        self.clock.advance(1.0)
        return d

    def run(self, loads):
        return [self.step(x) for x in loads]


def test_needed_instances_rounds_up_and_clamps():
    lim = KindLimits(100.0, 1, 5)
    assert needed_instances(0, lim, 0.6) == 1
    assert needed_instances(60, lim, 0.6) == 1
    assert needed_instances(61, lim, 0.6) == 2
    assert needed_instances(10_000, lim, 0.6) == 5


def test_scale_out_above_high_watermark_to_what_the_load_needs():
    drv = Driver(config())
    assert drv.step(70) is None  # 70% < 80%: fine
    d = drv.step(250)  # 250% of one instance
    assert d is not None and d.code == "overload"
    assert (d.current, d.desired) == (1, math.ceil(250 / (0.6 * T_SF)))  # 5
    assert "250/s" in d.reason and "T=100/s" in d.reason


def test_a_burst_gives_one_decision_while_the_action_is_pending():
    drv = Driver(config(), act_delay=5)
    out = drv.run([300] * 5)  # sustained overload while instances start
    assert sum(d is not None for d in out) == 1
    assert drv.decisions[0][1].desired == 5  # 1 + max_step_out 4
    # Busy (the reconciler is still acting) blocks too, even with no own target.
    drv2 = Driver(config())
    assert drv2.step(300, busy=True) is None
    assert drv2.step(300) is not None


def test_next_scale_out_waits_for_target_and_cooldown():
    drv = Driver(config(max_step_out=1), act_delay=1)
    decisions = [d for d in drv.run([400] * 8) if d is not None]
    # One at a time: 1->2 at t=0, lands t=1; cooldown 2 s -> 2->3 at t=2, ...
    assert [(d.current, d.desired) for d in decisions] == [(1, 2), (2, 3), (3, 4), (4, 5)]
    times = [t for t, _ in drv.decisions]
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(times))


def test_max_instances_caps_scale_out():
    drv = Driver(config(limits={"schedule": KindLimits(T_SF, 1, 3)}), act_delay=1)
    drv.run([10_000] * 10)
    assert drv.instances == 3
    assert all(d.desired <= 3 for _, d in drv.decisions)


def test_scale_in_after_low_load_for_the_cooldown_one_at_a_time():
    drv = Driver(config(), instances=4, act_delay=1)
    out = drv.run([100] * 3)  # 25% of 4 x T: below low watermark, but not for long
    assert out == [None, None, None]
    out = drv.run([100] * 10)
    ins = [d for d in out if d is not None]
    assert len(ins) == 1 and (ins[0].current, ins[0].desired) == (4, 3)
    assert ins[0].code == "underload" and "for 10s" in ins[0].reason
    # 100/s on 3 instances = 33%: no longer below 30%, so it stays at 3.
    assert all(d is None for d in drv.run([100] * 30)) and drv.instances == 3


def test_scale_in_never_below_min_and_not_if_the_rest_would_run_hot():
    drv = Driver(config(limits={"schedule": KindLimits(T_SF, 2, 6)}), instances=3, act_delay=1)
    drv.run([0] * 60)
    assert drv.instances == 2
    # 2 instances at 25% each: removing one would make 50%... allowed (<= 60%),
    # but min is 2, so it stays.
    assert [d.desired for _, d in drv.decisions] == [2]
    hot = Driver(config(low_watermark=0.45), instances=2, act_delay=1)
    hot.run([85] * 30)  # 42.5% < 45%, but 85/s on one instance is 85% > target 60%
    assert hot.decisions == []


def test_below_min_is_corrected_first_and_above_max_too():
    cfg = config(limits={"schedule": KindLimits(T_SF, 2, 4)})
    drv = Driver(cfg, instances=1, act_delay=1)
    d = drv.step(0)
    assert d is not None and (d.code, d.desired) == ("below_min", 2)
    drv2 = Driver(cfg, instances=6, act_delay=1)
    d2 = drv2.step(500)
    assert d2 is not None and (d2.code, d2.desired) == ("above_max", 4)
    # No instance at all: bootstrapping is the deployment's job, not ours.
    assert Driver(cfg, instances=0).step(500) is None


def test_a_kind_whose_every_instance_was_lost_is_started_again():
    cfg = config(limits={"schedule": KindLimits(T_SF, 2, 4)})
    drv = Driver(cfg, instances=2, act_delay=1)
    assert drv.step(10) is None  # at its minimum: nothing to do
    drv.instances = 0  # every instance crashed and expired
    d = drv.step(10)
    assert d is not None and (d.code, d.current, d.desired) == ("lost", 0, 2)
    assert drv.step(10) is None  # pending: one decision, not one per tick
    drv.step(10)
    assert drv.instances == 2


def test_one_decision_per_tick_across_kinds_most_loaded_first():
    cfg = config(
        limits={
            "dispatch": KindLimits(1000.0, 1, 8),
            "schedule": KindLimits(T_SF, 1, 8),
            "clustermgr": KindLimits(1000.0, 1, 8),
        }
    )
    state = ScalingState()
    loads = {
        "dispatch": KindLoad(1, 900),  # 90%
        "schedule": KindLoad(1, 300),  # 300%
        "clustermgr": KindLoad(2, 100),  # 5%, but not for long
    }
    d1, state = decide(ScalingContext(0.0, loads, cfg), state)
    assert d1 is not None and d1.kind == "schedule"
    d2, state = decide(ScalingContext(1.0, loads, cfg), state)
    assert d2 is not None and d2.kind == "dispatch"  # schedule is pending now
    d3, state = decide(ScalingContext(2.0, loads, cfg), state)
    assert d3 is None


def test_a_target_not_reached_in_time_no_longer_blocks():
    drv = Driver(config(action_timeout_s=5.0), act_delay=1000)  # never lands
    out = drv.run([300] * 8)
    ds = [d for d in out if d is not None]
    assert len(ds) == 2  # t=0, then again after the 5 s timeout
    assert drv.decisions[1][0] - drv.decisions[0][0] >= 5.0


def test_load_falling_brings_instances_back_down():
    drv = Driver(config(scale_in_cooldown_s=5.0), act_delay=1)
    drv.run([350] * 6)  # burst
    peak = drv.instances
    assert peak >= 4
    drv.run([0] * 60)  # quiet
    assert drv.instances == 1
    ins = [d for _, d in drv.decisions if d.delta < 0]
    assert len(ins) == peak - 1 and all(d.delta == -1 for d in ins)


@pytest.mark.parametrize(
    "kw",
    [
        dict(low_watermark=0.7),  # above target
        dict(high_watermark=0.5),  # below target
        dict(max_step_out=0),
        dict(scale_in_cooldown_s=-1),
    ],
)
def test_bad_config_is_rejected(kw):
    with pytest.raises(ValueError):
        config(**kw)


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError):
        KindLimits(0.0)
    with pytest.raises(ValueError):
        KindLimits(10.0, min_instances=0)
    with pytest.raises(ValueError):
        KindLimits(10.0, min_instances=3, max_instances=2)


def _one(cfg: ScalingConfig, kl: KindLoad, now: float = 100.0):
    return decide(ScalingContext(now, {"schedule": kl}, cfg), ScalingState())[0]


def test_busy_cores_count_when_the_ops_price_misses_them():
    # 4 instances at 40% by ops, but 85% busy on CPU (each operation now
    # costs more than T prices): overloaded, sized by the CPU.
    cfg = config(max_step_out=None, limits={"schedule": KindLimits(T_SF, 1, 64)})
    assert _one(cfg, KindLoad(4, 160.0)) is None
    d = _one(cfg, KindLoad(4, 160.0, cpu=4 * 0.85))
    assert d is not None and d.code == "overload"
    assert d.desired == math.ceil(4 * 0.85 / 0.6)
    assert needed_instances(160.0, KindLimits(T_SF, 1, 64), 0.6, cpu=3.4) == 6


def test_saturated_instances_grow_at_least_by_the_saturated_factor():
    # Saturated CPU censors the load: ops alone would ask for 7, the
    # slow-start rule doubles.
    cfg = config(max_step_out=None, limits={"schedule": KindLimits(T_SF, 1, 64)})
    d = _one(cfg, KindLoad(4, 4 * T_SF, cpu=4 * 0.97))
    assert d is not None and d.desired == 8
    # Busy but not saturated: the load-sized step.
    d = _one(cfg, KindLoad(4, 4 * T_SF, cpu=4 * 0.5))
    assert d is not None and d.desired == math.ceil(4 * T_SF / (0.6 * T_SF))


def test_no_scale_in_while_the_cpu_is_busy():
    cfg = config(scale_in_cooldown_s=0.0)
    # Few ops but busy cores: removing one would run the rest above target.
    state = ScalingState()
    for now in (0.0, 1.0, 2.0):
        d, state = decide(ScalingContext(now, {"schedule": KindLoad(3, 10.0, cpu=1.5)}, cfg), state)
        assert d is None or d.code != "underload"
