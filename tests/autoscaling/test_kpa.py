"""KPA autoscaler: scripted traces driven tick by tick with a ManualClock."""

import math

import pytest

from controlplane.runtime.clock import ManualClock
from functions.dispatch.autoscaling import (
    FixedKeepAlive,
    InstanceView,
    KpaAutoscaler,
    KpaConfig,
    ScaleDecision,
    idle_instances_to_remove,
)
from functions.dispatch.policy import FunctionRouter, Instance

TICK = 2.0


class Trace:
    """A function whose instances start instantly: ready follows desired."""

    def __init__(self, config, keepalive=None, ready=0, start=0.0):
        self.clock = ManualClock(start)
        self.kpa = KpaAutoscaler(config, keepalive)
        self.ready = ready
        self.log: list[tuple[float, ScaleDecision]] = []

    def run(self, seconds, load, apply=True):
        """Tick for ``seconds`` with constant concurrency ``load``."""
        for _ in range(round(seconds / TICK)):
            self.clock.advance(TICK)
            now = self.clock.now()
            self.kpa.observe(now, load)
            d = self.kpa.decide(now, self.ready)
            self.log.append((now, d))
            if apply:
                self.ready = d.desired
        return self.log[-1][1]


def cfg(**kw):
    kw.setdefault("target_concurrency", 10.0)
    return KpaConfig(**kw)


# -- config -----------------------------------------------------------------


def test_defaults_are_galaxys_and_knative_baseline_is_exact():
    c = KpaConfig(target_concurrency=4)
    assert (c.target_utilization, c.stable_window_s, c.panic_window_s) == (1.0, 60.0, 6.0)
    assert (c.panic_threshold, c.max_scale_up_rate, c.max_scale_down_rate) == (2.0, 1000.0, 2.0)
    assert (c.scale_to_zero_grace_s, c.min_scale, c.max_scale, c.tick_s) == (30.0, 0, None, 2.0)
    k = KpaConfig.knative_baseline(target_concurrency=10)
    assert k.tick_s == 2.0 and k.stable_window_s == 60.0
    assert math.isclose(k.panic_window_s, 6.0)
    assert (k.panic_threshold, k.target_utilization, k.scale_to_zero_grace_s) == (2.0, 0.7, 30.0)
    assert (k.max_scale_up_rate, k.max_scale_down_rate) == (1000.0, 2.0)
    assert KpaConfig.knative_baseline().target_concurrency == 100.0
    assert KpaConfig.knative_baseline(max_scale=5).max_scale == 5


@pytest.mark.parametrize(
    "field,value",
    [
        ("target_concurrency", 0),
        ("target_utilization", 0),
        ("target_utilization", 1.5),
        ("stable_window_s", -1),
        ("panic_window_fraction", 0),
        ("panic_window_fraction", 0.01),  # 0.6 s panic window < 2 s tick
        ("panic_threshold", 1.0),
        ("max_scale_up_rate", 1.0),
        ("max_scale_down_rate", 0.5),
        ("scale_to_zero_grace_s", -1),
        ("min_scale", -1),
        ("min_scale", 1.5),
        ("max_scale", 0),
        ("tick_s", 0),
        ("stable_window_s", float("nan")),
        ("target_utilization", True),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"KpaConfig.{field} must be"):
        cfg(**{field: value})


def test_max_scale_below_min_scale_is_rejected():
    with pytest.raises(ValueError, match=r"KpaConfig\.max_scale must be >= max\(1, min_scale\)"):
        cfg(min_scale=3, max_scale=2)


def test_time_going_backward_and_bad_samples_are_rejected():
    a = KpaAutoscaler(cfg())
    a.observe(10.0, 1)
    with pytest.raises(ValueError, match="time went backward"):
        a.observe(9.0, 1)
    with pytest.raises(ValueError, match="concurrency"):
        a.observe(11.0, -1)
    with pytest.raises(ValueError, match="ready_instances"):
        a.decide(11.0, -1)


# -- steady state and bursts --------------------------------------------------


@pytest.mark.parametrize("load,util,expect", [(35, 1.0, 4), (35, 0.7, 5), (70, 0.7, 10)])
def test_steady_load_converges_to_ceil_load_over_target(load, util, expect):
    t = Trace(cfg(target_utilization=util), ready=1)
    d = t.run(120, load)
    assert d.desired == expect == math.ceil(load / (10 * util) - 1e-9)
    assert not d.panic
    assert {d.desired for _, d in t.log[-10:]} == {expect}  # stays there


def test_ten_x_burst_panics_and_scales_up_within_one_tick():
    t = Trace(cfg(), ready=1)
    t.run(120, 10)  # 10 concurrent, target 10 -> 1 instance
    assert t.ready == 1 and not t.kpa.in_panic
    d = t.run(TICK, 100)  # one tick of a 10x burst
    # panic window (6 s) holds 10, 10, 100 -> 40 -> 4 instances; the stable
    # window alone would give ceil((29*10 + 100) / 30 / 10) = 2.
    assert d.panic and d.desired == 4
    assert d.to_start == 3
    d = t.run(2 * TICK, 100)
    assert d.desired == 10  # the panic window is full of the burst


def test_burst_scale_up_is_bounded_by_max_scale_up_rate():
    t = Trace(cfg(max_scale_up_rate=2.0), ready=1)
    t.run(120, 10)
    d = t.run(TICK, 1000)
    assert d.panic and d.desired == 2  # ready 1 x rate 2, not 100
    d = t.run(TICK, 1000)
    assert d.desired == 4  # then 2 x 2


def test_no_scale_down_during_panic_then_scale_down_after_stable_window():
    t = Trace(cfg(), ready=1)
    t.run(120, 10)
    t.log.clear()
    t.run(10, 100)
    panic_at = t.log[0][0]  # the first burst tick is the only one over the threshold
    peak = t.ready
    assert peak == 10 and t.kpa.in_panic
    t.log.clear()
    t.run(120, 10)  # back to normal
    in_panic = [(now, d) for now, d in t.log if d.panic]
    assert all(d.desired == peak for _, d in in_panic)  # never below the peak in panic
    # Panic is held a whole stable window after the last reason to panic.
    assert max(now for now, _ in in_panic) == panic_at + 60 - TICK
    after = [d.desired for now, d in t.log if now >= panic_at + 60]
    assert after[0] < peak  # scales down once panic is over...
    assert all(b >= math.floor(a / 2) for a, b in zip([peak, *after], after, strict=False))
    assert after[-1] == 1  # ...down to the load's need, at most halving per tick


def test_panic_threshold_compares_panic_desired_with_ready():
    t = Trace(cfg(), ready=4)
    d = t.run(TICK, 70)  # wants 7 < 2 x 4
    assert not d.panic
    t2 = Trace(cfg(), ready=4)
    d = t2.run(TICK, 80)  # wants 8 >= 2 x 4
    assert d.panic


# -- bounds ------------------------------------------------------------------


def test_min_and_max_scale_clamp():
    t = Trace(cfg(min_scale=2, max_scale=3), ready=2)
    assert t.run(300, 0).desired == 2  # idle, never below min_scale (no zero)
    assert t.run(120, 500).desired == 3  # heavy load, never above max_scale
    assert "clamped" in t.log[-1][1].reason


# -- scale to zero -----------------------------------------------------------


def zero_time(t):
    """First time the function went to zero in the log."""
    return next(now for now, d in t.log if d.desired == 0)


def test_scale_to_zero_waits_for_a_stable_window_without_traffic():
    t = Trace(cfg(scale_to_zero_grace_s=30), ready=1)
    t.run(60, 5)
    idle_at = t.clock.now()
    t.log.clear()
    t.run(200, 0)
    # The window (60 s) binds before the 30 s grace: zero once the last busy
    # sample (at idle_at) left the window.
    assert zero_time(t) == idle_at + 60
    assert all(d.desired == 1 for now, d in t.log if now < idle_at + 60)


def test_scale_to_zero_only_after_the_grace_period():
    t = Trace(cfg(stable_window_s=20, scale_to_zero_grace_s=44), ready=1)
    t.run(60, 5)
    idle_at = t.clock.now() + TICK  # first zero sample
    t.log.clear()
    t.run(200, 0)
    assert zero_time(t) == idle_at + 44
    held = [d for now, d in t.log if now < idle_at + 44]
    assert held and all(d.desired == 1 and "grace" in d.reason for d in held[-5:])


def test_scale_to_zero_only_when_keep_alive_allows():
    t = Trace(cfg(scale_to_zero_grace_s=30), FixedKeepAlive(300), ready=1)
    t.run(60, 5)
    idle_at = t.clock.now() + TICK
    t.log.clear()
    t.run(600, 0)
    assert zero_time(t) == idle_at + 300
    assert "keep-alive" in next(d for now, d in t.log if now == idle_at + 298).reason


def test_function_never_used_stays_at_zero():
    t = Trace(cfg(), FixedKeepAlive(600), ready=0)
    t.run(100, 0)
    assert {d.desired for _, d in t.log} == {0}  # no instance started to be "kept"


def test_traffic_during_grace_restarts_the_idle_clock():
    t = Trace(cfg(stable_window_s=10, panic_window_fraction=0.2, scale_to_zero_grace_s=30), ready=1)
    t.run(20, 3)
    t.run(20, 0)
    t.run(TICK, 3)
    t.log.clear()
    t.run(28, 0)
    assert all(d.desired == 1 for _, d in t.log)


def test_short_request_between_samples_counts_as_activity_via_last_active():
    a = KpaAutoscaler(cfg(stable_window_s=10, panic_window_fraction=0.2, scale_to_zero_grace_s=30))
    a.observe(0.0, 2)
    for now in range(2, 32, 2):
        # A request granted and released at t=21 was never sampled.
        a.observe(float(now), 0, last_active=21.0 if now >= 22 else 1.0)
    assert a.idle_since == 21.0
    assert a.decide(30.0, 1).desired == 1  # idle only 9 s: within grace
    a.observe(50.0, 0, last_active=21.0)
    assert a.decide(50.0, 1).desired == 1  # 29 s
    a.observe(52.0, 0, last_active=21.0)
    assert a.decide(52.0, 1).desired == 0  # idle 31 s


class ScriptedKeepAlive:
    """Pre-warm at 120 s after the idle start, keep 60 s."""

    def __init__(self):
        self.events = []

    def on_invocation(self, now):
        self.events.append(("invocation", now))

    def on_idle_start(self, now):
        self.events.append(("idle", now))

    def keep_alive_s(self, now):
        return 60.0

    def prewarm_s(self, now):
        return 120.0


def test_prewarm_window_brings_one_instance_back_and_events_reach_the_policy():
    ka = ScriptedKeepAlive()
    t = Trace(
        cfg(stable_window_s=10, panic_window_fraction=0.2, scale_to_zero_grace_s=4), ka, ready=1
    )
    t.run(10, 5)
    idle_at = t.clock.now() + TICK
    t.log.clear()
    t.run(300, 0)
    want = {now: d.desired for now, d in t.log}
    assert want[idle_at + 20] == 0  # unloaded once the window and grace allow
    assert want[idle_at + 118] == 0
    assert want[idle_at + 120] == 1 and want[idle_at + 178] == 1  # pre-warmed
    assert want[idle_at + 180] == 0  # keep-alive over
    t.run(TICK, 5)
    assert ka.events == [("idle", idle_at), ("invocation", t.clock.now())]


def test_next_prewarm_at_tells_when_to_wake_an_idle_function():
    t = Trace(cfg(), ScriptedKeepAlive(), ready=1)
    assert t.kpa.next_prewarm_at(0.0) is None  # no idle period after traffic yet
    t.run(10, 5)
    assert t.kpa.next_prewarm_at(t.clock.now()) is None  # busy
    t.run(TICK, 0)
    idle_at = t.clock.now()
    assert t.kpa.next_prewarm_at(idle_at) == idle_at + 120
    assert t.kpa.next_prewarm_at(idle_at + 121) == idle_at + 121  # due now
    assert t.kpa.next_prewarm_at(idle_at + 180) is None  # pre-warm window over
    assert Trace(cfg(), FixedKeepAlive(60)).kpa.next_prewarm_at(0.0) is None


def test_pending_starts_count_toward_desired():
    a = KpaAutoscaler(cfg())
    a.observe(2.0, 50)
    d = a.decide(2.0, ready_instances=0, pending=2)
    assert d.desired == 5 and d.to_start == 3 and d.to_remove == 0


# -- which instances to remove --------------------------------------------------


def test_idle_instances_to_remove_never_picks_a_busy_one_and_prefers_newest():
    insts = [
        InstanceView("old", in_flight=0, added_at=1.0),
        InstanceView("busy-new", in_flight=1, added_at=9.0),
        InstanceView("new", in_flight=0, added_at=8.0),
        InstanceView("mid", in_flight=0, added_at=5.0),
        InstanceView("leaving", in_flight=0, added_at=7.0, draining=True),
    ]
    assert idle_instances_to_remove(insts, 2) == ["new", "mid"]
    assert idle_instances_to_remove(insts, 10) == ["new", "mid", "old"]  # fewer: not enough idle
    assert idle_instances_to_remove(insts, 0) == []
    for n in range(6):
        assert "busy-new" not in idle_instances_to_remove(insts, n)


def test_ties_go_to_the_longest_idle_then_by_id():
    insts = [InstanceView(i, 0, added_at=3.0) for i in ("b", "a", "c")]
    assert idle_instances_to_remove(insts, 3, idle_since={"c": 1.0, "a": 5.0}) == ["c", "a", "b"]


def test_scale_down_wiring_with_the_dispatch_router():
    clock = ManualClock()
    r = FunctionRouter("f", concurrency=10, max_scale=10, clock=clock)
    for i in range(3):
        clock.advance(1)
        r.add_instance(Instance(f"i{i}", f"a{i}", "n0", 10))
    g = r.acquire()  # lands on the oldest (least loaded, ties to oldest)
    assert g is not None and g.instance.instance_id == "i0"
    a = KpaAutoscaler(cfg())
    a.observe(clock.now(), 1)
    d = a.decide(clock.now(), r.live_count(), r.pending)
    assert d.desired == 1 and d.to_remove == 2
    victims = a.instances_to_remove(d, r.instances.values())
    assert victims == ["i2", "i1"]
    for iid in victims:  # drain first (no new requests), then remove from tables
        assert r.drain(iid)
        assert r.remove_instance(iid) is not None
    assert list(r.instances) == ["i0"]


def test_float_error_does_not_add_an_instance():
    a = KpaAutoscaler(cfg(target_concurrency=3, target_utilization=0.7))
    a.observe(2.0, 2.1)  # 2.1 / 2.1 is 1.0000000000000002 in floats
    assert a.decide(2.0, 1).desired == 1
