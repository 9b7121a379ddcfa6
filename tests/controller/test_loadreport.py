"""The load reporter: counter deltas to rates, and reports reaching a real
controller over loopback gRPC (including re-registration after the
controller forgot the instance)."""

from __future__ import annotations

import pytest

from controlplane.controller.actuators.base import NoActuator
from controlplane.controller.registry import State
from controlplane.runtime import rpc
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.loadreport import CPU_KEY, CpuMeter, LoadReporter, rates, report_due
from galaxy.v1 import common_pb2, controller_pb2_grpc
from tests.controller.conftest import Controller

S = common_pb2.CONTROL_KIND_SCHEDULE


def test_rates_are_deltas_per_second_and_errors_a_count():
    ops, errors = rates(
        {"schedule": 100, "placement": 90, "errors": 3},
        {"schedule": 300, "placement": 250, "errors": 5, "new": 8},
        2.0,
    )
    assert ops == {"schedule": 100.0, "placement": 80.0, "new": 4.0}
    assert errors == 2


def test_a_counter_that_went_back_counts_from_zero():
    ops, _ = rates({"dispatch": 1000}, {"dispatch": 30}, 1.0)
    assert ops == {"dispatch": 30.0}
    with pytest.raises(ValueError):
        rates({}, {}, 0.0)


class Counting:
    """A component exposing the optional load hooks."""

    kind = S

    def __init__(self) -> None:
        self.counters = {"schedule": 0, "placement": 0}
        self.queue = 0
        self.memberships: list[common_pb2.Membership] = []

    def load_counters(self):
        return dict(self.counters)

    def queue_depth(self):
        return self.queue

    def on_membership(self, m):
        self.memberships.append(m)


async def test_reports_reach_the_controller_and_aggregate_per_kind():
    ctl = await Controller(NoActuator(), enabled=False).start()
    pool = rpc.ChannelPool()
    try:
        clock = ManualClock(10.0)
        cpu = {"ms": 0}
        comps, reporters = [], []
        for i in range(3):
            me = common_pb2.ControlInstance(id=f"s-{i}", kind=S, address=f"127.0.0.1:{40000 + i}")
            ctl.registry.register(me)
            ctl.registry.set_state(S, me.id, State.READY)  # no warm-up in this test
            c = Counting()
            comps.append(c)
            reporters.append(
                LoadReporter(c, me, ctl.address, pool, clock=clock, cpu_ms=lambda: cpu["ms"])
            )
        clock.advance(1.0)
        cpu["ms"] += 600  # each process (the same fake here) was 0.6 cores busy
        for i, (c, r) in enumerate(zip(comps, reporters, strict=True)):
            c.counters["schedule"] += 50 * (i + 1)  # 50, 100, 150 per second
            c.queue = i
            reply = await r.report_once()
            assert reply is not None and not reply.membership_stale
        kl = ctl.reconciler.kind_load("schedule", ctl.registry.clock.now())
        assert kl.load == pytest.approx(300.0)
        assert kl.queue_depth == 3
        assert kl.cpu == pytest.approx(3 * 0.6)
        m = ctl.registry.get(S, "s-1")
        assert m.ops_per_second == {"schedule": 100.0, "placement": 0.0, CPU_KEY: 600.0}
        st = ctl.reconciler.status()
        sched = next(s for s in st if s.kind == S)
        assert sched.load == pytest.approx(300.0) and sched.load_op == "schedule"
        # ops say 100%, CPU 60%: the larger counts
        assert sched.utilization == pytest.approx(300.0 / (3 * 100.0))
    finally:
        await pool.close()
        await ctl.stop()


async def test_reporter_registers_again_when_the_controller_forgot_it():
    ctl = await Controller(NoActuator(), enabled=False).start()
    pool = rpc.ChannelPool()
    me = common_pb2.ControlInstance(id="s-x", kind=S, address="127.0.0.1:40999")
    comp = Counting()

    async def reregister():
        async with pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as s:
            return await s.RegisterInstance(me)

    r = LoadReporter(
        comp, me, ctl.address, pool, reregister=reregister, on_membership=comp.on_membership
    )
    try:
        reply = await r.report_once()
        assert reply.membership_stale  # never registered: the controller says so
        assert ctl.registry.get(S, "s-x") is not None
        assert comp.memberships and any(i.id == "s-x" for i in comp.memberships[-1].instances)
        assert not (await r.report_once()).membership_stale
    finally:
        await pool.close()
        await ctl.stop()


async def test_report_to_an_unreachable_controller_is_not_fatal():
    pool = rpc.ChannelPool(RpcConfig(deadline_s=0.5))
    me = common_pb2.ControlInstance(id="s-y", kind=S, address="127.0.0.1:1")
    r = LoadReporter(Counting(), me, "127.0.0.1:1", pool, interval_s=0.2)
    try:
        assert await r.report_once() is None
    finally:
        await pool.close()


def test_cpu_meter_gives_busy_cores_between_reads():
    m = CpuMeter(1_000, 10.0)
    assert m.read(1_250, 10.5) == pytest.approx(0.5)
    assert m.read(1_750, 10.75) == pytest.approx(2.0)  # two cores busy
    assert m.read(1_750, 10.75) == 0.0  # no time passed: no division by zero


def test_a_report_is_due_at_the_interval_or_at_once_when_saturated():
    assert not report_due(0.25, 1.0, 0.5)
    assert report_due(1.0, 1.0, 0.0)
    assert report_due(0.25, 1.0, 0.95)  # saturated: the controller hears now


def test_the_reporter_checks_cpu_on_the_short_period():
    clock = ManualClock(0.0)
    cpu = {"ms": 0}
    me = common_pb2.ControlInstance(id="s-c", kind=S, address="127.0.0.1:1")
    r = LoadReporter(
        Counting(), me, "127.0.0.1:2", rpc.ChannelPool(), clock=clock,
        cpu_ms=lambda: cpu["ms"],
    )  # fmt: skip
    clock.advance(0.25)
    cpu["ms"] += 50  # 0.2 cores
    assert not r.due()
    clock.advance(0.25)
    cpu["ms"] += 240  # 0.96 cores since the last check
    assert r.due()
    report = r.sample()
    assert report.ops_per_second[CPU_KEY] == pytest.approx(290 / 0.5)
