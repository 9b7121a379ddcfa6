"""Member states and views of the registry; controller flags and the
calibration file."""

from __future__ import annotations

import json

import pytest

from controlplane.controller.capacities import DEFAULT_T, calibrated_capacities
from controlplane.controller.main import scaling_config
from controlplane.controller.registry import WARM_AUDIENCE, ControlRegistry, State
from controlplane.runtime.clock import ManualClock
from controlplane.tools.cli import build_parser
from galaxy.v1 import common_pb2

D, S, C = (
    common_pb2.CONTROL_KIND_DISPATCH,
    common_pb2.CONTROL_KIND_SCHEDULE,
    common_pb2.CONTROL_KIND_CLUSTERMGR,
)


def ci(kind, i):
    return common_pb2.ControlInstance(id=i, kind=kind, address=f"h:{abs(hash(i)) % 60000}")


def ids(m):
    return [i.id for i in m.instances]


def test_a_warming_schedule_is_seen_by_its_feeders_only_and_draining_by_nobody():
    r = ControlRegistry(warm_kinds=WARM_AUDIENCE)
    for k, i in ((D, "d"), (S, "s0"), (C, "c")):
        r.register(ci(k, i))
        if k == S:
            r.set_state(S, "s0", State.READY)
    r.register(ci(S, "s1"))
    assert r.get(S, "s1").state is State.WARMING
    assert ids(r.membership(C)) == ["d", "s0", "s1", "c"]
    assert ids(r.membership(S)) == ["d", "s0", "s1", "c"]
    assert ids(r.membership(D)) == ["d", "s0", "c"]
    assert ids(r.membership()) == ["d", "s0", "c"]  # node agents, clients
    e = r.epoch
    assert r.set_state(S, "s1", State.READY) and r.epoch == e + 1
    assert not r.set_state(S, "s1", State.READY)
    r.set_state(S, "s0", State.DRAINING)
    assert "s0" not in ids(r.membership(S)) and "s0" not in ids(r.membership())
    assert r.get(S, "s0") is not None  # still a member: its reports count


def test_a_standby_is_seen_by_nobody_until_promoted_oldest_first():
    clock = ManualClock()
    r = ControlRegistry(clock, warm_kinds=WARM_AUDIENCE)
    r.register(ci(D, "d"))
    epoch = r.epoch
    for i in ("s-sb1", "s-sb2"):
        clock.advance(1.0)
        sb = ci(S, i)
        sb.standby = True
        assert r.register(sb)
    # A standby changes nobody's view, so no new epoch either.
    assert r.epoch == epoch
    assert all(r.get(S, i).state is State.STANDBY for i in ("s-sb1", "s-sb2"))
    for viewer in (None, D, S, C):
        assert ids(r.membership(viewer)) == ["d"]
    (p,) = r.promote(S, 1)
    assert p.info.id == "s-sb1" and p.state is State.WARMING  # joins as a new one would
    assert r.epoch == epoch + 1
    assert not p.info.standby  # memberships never carry the flag
    assert ids(r.membership(C)) == ["d", "s-sb1"] and ids(r.membership(D)) == ["d"]
    assert not r.register(ci(D, "d"))  # re-registering is still a no-op
    d_sb = ci(D, "d-sb")
    d_sb.standby = True
    r.register(d_sb)
    assert [m.info.id for m in r.promote(D, 5)] == ["d-sb"]  # only what there is
    assert r.get(D, "d-sb").state is State.READY
    assert r.promote(D, 1) == []


def test_silent_members_expire_but_never_reporting_ones_stay():
    clock = ManualClock()
    r = ControlRegistry(clock)
    r.register(ci(D, "quiet"))
    r.register(ci(D, "talker"))
    r.report(D, "talker", {"dispatch": 1.0}, 0, 0)
    clock.advance(10)
    gone = r.expire(5.0)
    assert [m.info.id for m in gone] == ["talker"]
    assert ids(r.membership()) == ["quiet"]


def test_seeded_members_expire_unless_they_report_and_epochs_jump():
    clock = ManualClock()
    r = ControlRegistry(clock)
    r.seed([ci(S, "a"), ci(S, "b")], epoch_base=7 << 20)
    assert r.epoch >= 7 << 20
    r.report(S, "a", {}, 0, 0)
    clock.advance(6)
    r.report(S, "a", {}, 0, 0)
    assert [m.info.id for m in r.expire(5.0)] == ["b"]


def test_seeded_members_not_heard_from_are_checked_sooner():
    # After a takeover: the old leader's own instances died with it; the
    # members that answer are kept by the health check that follows.
    clock = ManualClock()
    r = ControlRegistry(clock)
    r.seed([ci(D, "heard"), ci(D, "unheard")], epoch_base=1 << 20)
    r.report(D, "heard", {}, 0, 0)
    clock.advance(1.5)
    assert [m.info.id for m in r.silent(5.0, unconfirmed_s=1.0)] == ["unheard"]
    assert r.silent(5.0) == []  # without the shorter bound: not yet
    clock.advance(4.0)
    assert sorted(m.info.id for m in r.silent(5.0, unconfirmed_s=1.0)) == ["heard", "unheard"]


def parse(*flags):
    return build_parser().parse_args(["serve", "controller", *flags])


@pytest.mark.slow
def test_flags_build_the_policy_config(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"t_df": 900.0, "t_sf": 123.0, "t_cmf": 0}))
    cfg = scaling_config(
        parse(
            "--calibration", str(cal), "--t-cmf", "777", "--min-instances", "schedule=2",
            "--max-instances", "schedule=5", "--high-watermark", "0.9",
        )
    )  # fmt: skip
    assert cfg.limits["dispatch"].capacity == 900.0
    assert cfg.limits["schedule"].capacity == 123.0
    assert cfg.limits["clustermgr"].capacity == 777.0  # flag beats file (file had 0)
    assert (cfg.limits["schedule"].min_instances, cfg.limits["schedule"].max_instances) == (2, 5)
    assert cfg.high_watermark == 0.9
    with pytest.raises(SystemExit):
        parse("--min-instances", "nodeagent=2")


def test_calibration_file_defaults_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("GALAXY_CALIBRATION", str(tmp_path / "absent.json"))
    assert calibrated_capacities() == DEFAULT_T  # no file yet: defaults
    with pytest.raises(SystemExit, match="not found"):
        calibrated_capacities(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(SystemExit, match="not valid JSON"):
        calibrated_capacities(bad)


def test_a_restarted_controller_is_not_ignored_as_older() -> None:
    """Components ignore a membership older than the one they hold: the
    epochs of a controller restarted (no HA, nothing stored) a second later
    must start above all its previous incarnation sent."""
    from controlplane.controller.registry import wall_epoch_base
    from controlplane.runtime.membership import MembershipView

    t0 = 1_764_000_000.0
    first = ControlRegistry(epoch_base=wall_epoch_base(t0))
    for i in range(5000):  # a busy life: many membership changes
        first.register(
            common_pb2.ControlInstance(id=f"d{i % 7}", kind=S, address=f"10.0.0.{i % 250}:1")
        )
    held = MembershipView()
    assert held.update(first.membership())
    second = ControlRegistry(epoch_base=wall_epoch_base(t0 + 1.0))
    second.register(common_pb2.ControlInstance(id="d0", kind=S, address="10.0.0.9:1"))
    assert second.epoch > first.epoch
    assert held.update(second.membership()), "the new controller's membership was ignored"
    # Without the base (as before) it would have been ignored.
    naive = ControlRegistry()
    naive.register(common_pb2.ControlInstance(id="d0", kind=S, address="10.0.0.9:1"))
    assert not held.update(naive.membership())


def test_the_controller_numbers_epochs_from_the_wall_clock() -> None:
    import time

    from controlplane.controller.main import build
    from controlplane.controller.registry import wall_epoch_base

    before = wall_epoch_base(time.time())
    component = build(parse("--insecure"))
    component.services()  # builds the servicer and its registry
    assert component.servicer is not None
    assert component.servicer.registry.epoch >= before
