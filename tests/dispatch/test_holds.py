"""Holds (leases a caller keeps for its next requests, the gateway's slot
cache) in the pure policy: when Dispatch grants one and for how long, how a
routing change closes them, and which revision choices may be cached."""

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.revisions import settled
from functions.dispatch.policy import HOLD_S, FunctionRouter, Instance
from galaxy.v1 import common_pb2


def router() -> FunctionRouter:
    r = FunctionRouter("f", 1, 5, ManualClock())
    r.add_instance(Instance("i-0", "10.0.0.1:1", "n-0", 1))
    return r


def test_a_hold_is_granted_only_while_no_request_waits() -> None:
    r = router()
    assert r.acquire() is not None
    assert r.hold() == HOLD_S
    r.enqueue()  # the only slot is taken: a request waits
    assert r.acquire() is None
    assert r.hold() == 0.0  # a held slot would keep the waiter waiting


def test_closed_holds_are_refused_and_report_when_the_last_one_ends() -> None:
    r = router()
    clock = r.clock
    assert isinstance(clock, ManualClock)
    assert r.holds_left() == 0.0
    assert r.hold() == HOLD_S
    clock.advance(HOLD_S / 2)
    assert r.close_holds() == HOLD_S / 2  # the hold granted above ends then
    assert r.hold() == 0.0
    r.close_holds()  # a second change overlapping the first
    r.open_holds()
    assert r.hold() == 0.0  # still closed by the first
    r.open_holds()
    clock.advance(HOLD_S)
    assert r.holds_left() == 0.0
    assert r.hold() == HOLD_S


def test_no_holds_when_hold_time_is_zero() -> None:
    r = router()
    r.hold_s = 0.0
    assert r.hold() == 0.0 and r.holds_left() == 0.0


def spec(*targets: tuple[int, int, str], latest: int = 3) -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec(name="f", revision=latest)
    for rev, pct, tag in targets:
        s.traffic.append(common_pb2.TrafficTarget(revision=rev, percent=pct, tag=tag))
    return s


def test_settled_only_when_no_revision_is_drawn() -> None:
    def ready(rev: int) -> bool:
        return True

    def not_latest(rev: int) -> bool:
        return rev != 3

    assert settled(spec(), "", ready)  # latest=100 by default
    assert not settled(spec(), "", not_latest)  # a rollout waits for revision 3
    assert settled(spec((1, 100, ""), (2, 0, "canary")), "", ready)
    assert not settled(spec((1, 90, ""), (2, 10, "")), "", ready)  # a canary draw
    assert settled(spec((1, 90, ""), (2, 10, "canary")), "canary", ready)  # a tag pins
    assert not settled(spec((1, 100, "")), "nope", ready)  # an unknown tag
    assert not settled(spec((0, 100, "")), "", not_latest)
