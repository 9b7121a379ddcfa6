"""The local process actuator starts real `galaxy serve schedule` processes
that register with a real controller, and the reconcile loop scales out and
back in through it (drain first, then stop)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from controlplane.controller.actuators.base import ActuatorError
from controlplane.controller.actuators.local import LocalProcessActuator
from controlplane.controller.registry import State
from galaxy.v1 import common_pb2, controller_pb2, controller_pb2_grpc, schedule_pb2_grpc
from tests.controller.conftest import Controller, ScheduleStandIn, serve

S = common_pb2.CONTROL_KIND_SCHEDULE
pytestmark = pytest.mark.timeout(90)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


async def _teardown(reporter, act, ctl, sched) -> None:
    """Stop the stand-in's reporter, the actuator's processes, the controller
    and the stand-in, in that order."""
    if reporter is not None:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
    await act.close()
    await ctl.stop()
    await sched.stop(None)


def ready(ctl: Controller, iid: str) -> bool:
    m = ctl.registry.get(S, iid)
    return m is not None and m.state is State.READY


@pytest.mark.slow
async def test_starts_a_real_schedule_process_that_registers_then_stops_it(tmp_path):
    act = LocalProcessActuator(log_dir=tmp_path)
    ctl = await Controller(act, enabled=False).start()
    try:
        await act.start(ctl.address)
        (iid,) = await act.scale_out("schedule", 0, 1)
        assert iid.startswith("schedule-a")
        pid = act.pids()[iid]
        assert await ctl.changes.wait_for(lambda: ready(ctl, iid), 60), (
            tmp_path / f"{iid}.log"
        ).read_text()
        assert act.removable("schedule", [iid, "schedule-0"]) == [iid]
        await act.scale_in("schedule", iid, 0)
        assert not alive(pid)
        # The instance deregistered itself on its way out.
        assert ctl.registry.get(S, iid) is None
        with pytest.raises(ActuatorError):
            await act.scale_in("schedule", iid, 0)
    finally:
        await act.close()
        await ctl.stop()


@pytest.mark.slow
async def test_reconciler_scales_out_on_overload_and_back_in_after_drain(tmp_path):
    act = LocalProcessActuator(log_dir=tmp_path)
    ctl = await Controller(act, t_sf=100.0, max_step_out=1, scale_out_cooldown_s=600.0).start()
    sched, addr = await serve(
        schedule_pb2_grpc.add_ScheduleServicer_to_server,
        ScheduleStandIn("s-0"),
        "galaxy.v1.Schedule",
    )
    load = {"s-0": 250.0}

    async def report_forever(stub):
        me = common_pb2.ControlInstance(id="s-0", kind=S, address=addr)
        while True:
            await stub.ReportLoad(
                controller_pb2.LoadReport(instance=me, ops_per_second={"schedule": load["s-0"]})
            )
            await asyncio.sleep(0.1)  # the stand-in reports periodically, like the host

    reporter = None
    try:
        await act.start(ctl.address)
        async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as stub:
            await stub.RegisterInstance(common_pb2.ControlInstance(id="s-0", kind=S, address=addr))
            assert await ctl.changes.wait_for(lambda: ready(ctl, "s-0"), 10)
            reporter = asyncio.create_task(report_forever(stub))
            ctl.reconciler.start()
            # Overload: 250/s on one instance with T=100 -> one more instance.
            assert await ctl.changes.wait_for(lambda: len(act.children) == 1, 10)
            (iid,) = act.children
            pid = act.pids()[iid]
            assert await ctl.changes.wait_for(lambda: ready(ctl, iid), 60)
            await ctl.reconciler.wait_idle()
            out = ctl.reconciler.history[0]
            assert (out.decision.current, out.decision.desired) == (1, 2)
            assert out.outcome == "done" and out.instance_ids == [iid] and out.duration_s > 0
            # Exactly one action for the sustained overload (cooldown is long).
            assert len(ctl.reconciler.history) == 1
            # The load falls: after the scale-in cooldown the new one is drained
            # (removed from membership first) and stopped.
            load["s-0"] = 0.0
            assert await ctl.changes.wait_for(lambda: ctl.registry.get(S, iid) is None, 30)
            await ctl.reconciler.wait_idle()  # the action ends when the process has exited
            assert not alive(pid)
            last = ctl.reconciler.history[0]
            assert last.decision.code == "underload" and last.outcome == "done"
            assert [i.id for i in ctl.registry.membership(S).instances] == ["s-0"]
    finally:
        await _teardown(reporter, act, ctl, sched)


@pytest.mark.slow
async def test_a_killed_instance_is_reported_lost_at_once_and_a_stopped_one_is_not(tmp_path):
    act = LocalProcessActuator(log_dir=tmp_path)
    lost: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    act.on_lost = lambda kind, iid: lost.put_nowait((kind, iid))
    ctl = await Controller(act, enabled=False).start()
    try:
        await act.start(ctl.address)
        victim, kept = await act.scale_out("schedule", 0, 2)
        for iid in (victim, kept):
            assert await ctl.changes.wait_for(lambda i=iid: ready(ctl, i), 60)
        os.kill(act.pids()[victim], 9)
        assert await asyncio.wait_for(lost.get(), 30) == ("schedule", victim)
        await act.scale_in("schedule", kept, 0)  # on purpose: not a loss
        assert lost.empty()
    finally:
        await act.close()
        await ctl.stop()


@pytest.mark.slow
async def test_a_scale_out_promotes_a_warm_standby_and_starts_its_replacement(tmp_path):
    # One standby Schedule process, started by the actuator with --standby:
    # it registers, is seen by nobody, and the first scale-out promotes it
    # (no process start on that path) while a replacement standby starts.
    act = LocalProcessActuator(log_dir=tmp_path, standby={"schedule": 1})
    ctl = await Controller(act, t_sf=100.0, max_step_out=1, scale_out_cooldown_s=600.0).start()
    sched, addr = await serve(
        schedule_pb2_grpc.add_ScheduleServicer_to_server,
        ScheduleStandIn("s-0"),
        "galaxy.v1.Schedule",
    )
    me = common_pb2.ControlInstance(id="s-0", kind=S, address=addr)

    def standbys() -> list[str]:
        return [m.info.id for m in ctl.registry.members(S, State.STANDBY)]

    reporter = None
    try:
        await act.start(ctl.address)
        (sb,) = act.children
        assert await ctl.changes.wait_for(lambda: standbys() == [sb], 60), (
            tmp_path / f"{sb}.log"
        ).read_text()
        async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as stub:
            await stub.RegisterInstance(me)
            assert await ctl.changes.wait_for(lambda: ready(ctl, "s-0"), 10)
            for viewer in (None, S, common_pb2.CONTROL_KIND_DISPATCH):
                assert sb not in [i.id for i in ctl.registry.membership(viewer).instances]
            sb_info = common_pb2.ControlInstance(id=sb, kind=S, address="x:1")
            reply = await stub.ReportLoad(controller_pb2.LoadReport(instance=sb_info))
            assert reply.standby  # what a re-registration must say it is

            async def report_forever():
                while True:
                    await stub.ReportLoad(
                        controller_pb2.LoadReport(instance=me, ops_per_second={"schedule": 250.0})
                    )
                    await asyncio.sleep(0.1)  # the stand-in reports periodically

            reporter = asyncio.create_task(report_forever())
            ctl.reconciler.start()
            assert await ctl.changes.wait_for(lambda: ready(ctl, sb), 60)
            await ctl.reconciler.wait_idle()
            out = ctl.reconciler.history[0]
            assert (out.decision.current, out.decision.desired) == (1, 2)
            assert out.outcome == "done" and out.instance_ids == [sb]
            assert sb in [i.id for i in ctl.registry.membership(None).instances]
            reply = await stub.ReportLoad(controller_pb2.LoadReport(instance=sb_info))
            assert not reply.standby
            # The promoted standby is replaced by a new one.
            assert await ctl.changes.wait_for(
                lambda: len(standbys()) == 1 and standbys() != [sb], 60
            )
            assert set(act.children) == {sb, standbys()[0]}
    finally:
        await _teardown(reporter, act, ctl, sched)
