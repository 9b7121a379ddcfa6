"""Dispatch's protocol core (``functions/dispatch/ownership.py``) driven
with no I/O: events in, actions out, in the protocol's order."""

from __future__ import annotations

from controlplane.runtime.clock import ManualClock
from functions.dispatch import ownership as own
from functions.dispatch.policy import FunctionRouter, Instance


def router(name: str = "f", concurrency: int = 2) -> FunctionRouter:
    return FunctionRouter(name, concurrency, 4, ManualClock(), lease_prefix="d0:")


def inst(i: int, node: str = "n0") -> Instance:
    return Instance(f"i{i}", f"a{i}", node, 2)


def test_handover_drops_route_then_sends_instances_with_leases_and_holds_waiters() -> None:
    r = router()
    r.add_instance(inst(1))
    g1 = r.acquire()
    g2 = r.acquire()
    assert g1 is not None and g2 is not None
    w = r.enqueue("queued")
    core: own.Ownership[str, str] = own.Ownership()
    stay = router("g")
    acts = core.membership_changed({"f": r, "g": stay}, lambda k: "d1" if k == "f" else None)
    kinds = [type(a) for a in acts]
    # Routing state first (dropped, instances unrouted), then the send.
    assert kinds == [own.DropRoute, own.Unrouted, own.SendInstances]
    send = acts[2]
    assert isinstance(send, own.SendInstances)
    assert send.owner == "d1" and send.function == "f"
    [(moved, leases)] = send.instances
    assert moved.instance_id == "i1"
    assert sorted(leases) == sorted([g1.lease_id, g2.lease_id])
    # Nothing is forwarded before the instances are delivered.
    assert not any(isinstance(a, own.ForwardWaiters) for a in acts)
    assert core.handing_over("f") and not core.handing_over("g")
    late = core.hold("f", "arrived meanwhile")
    fwd = core.instances_sent(send.handover)
    assert len(fwd) == 1 and isinstance(fwd[0], own.ForwardWaiters)
    assert fwd[0].owner == "d1"
    assert [x.token for x in fwd[0].waiters] == [w.token, late.token]
    assert not core.handing_over("f")
    assert core.instances_sent(send.handover) == []  # once only


def test_a_function_moving_again_keeps_each_handovers_waiters_apart() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r1 = router()
    r1.enqueue("first")
    [_, s1] = core.membership_changed({"f": r1}, lambda k: "d1")
    r2 = router()
    r2.enqueue("second")
    [_, s2] = core.membership_changed({"f": r2}, lambda k: "d2")
    assert isinstance(s1, own.SendInstances) and isinstance(s2, own.SendInstances)
    [f1] = core.instances_sent(s1.handover)
    assert isinstance(f1, own.ForwardWaiters)
    assert (f1.owner, [w.token for w in f1.waiters]) == ("d1", ["first"])
    assert core.handing_over("f")  # the second handover is still under way
    [f2] = core.instances_sent(s2.handover)
    assert isinstance(f2, own.ForwardWaiters) and f2.owner == "d2"


def test_late_release_is_not_counted_when_the_lease_arrives() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router()
    known, grants = core.release(None, "old:f/1")  # before the handover lands
    assert (known, grants) == (False, [])
    r.add_instance(inst(1), leases=core.unreleased(["old:f/1", "old:f/2"]))
    assert r.instances["i1"].in_flight == 1
    assert set(r.leases) == {"old:f/2"}


def test_released_unknown_is_bounded() -> None:
    core: own.Ownership[str, str] = own.Ownership(released_max=2)
    for i in range(3):
        core.release(None, f"l{i}")
    r = router()
    r.add_instance(inst(1), leases=core.unreleased(["l0", "l1", "l2"]))
    assert set(r.leases) == {"l0"}  # the oldest was forgotten


def test_dead_node_unroutes_its_instances_and_asks_for_replacements() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router()
    r.add_instance(inst(1, "dead"))
    r.add_instance(inst(2, "alive"))
    acts = core.node_dead({"f": r, "g": router("g")}, "dead")
    assert [type(a) for a in acts] == [own.Unrouted, own.ScaleUp]
    assert list(r.instances) == ["i2"]


def test_deleted_function_fails_waiters_and_stops_instances() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router()
    r.add_instance(inst(1))
    w = r.enqueue("x")
    acts = core.function_deleted({"f": r}, ["f"], "gone")
    assert [type(a) for a in acts] == [
        own.DropRoute,
        own.FailWaiters,
        own.Unrouted,
        own.DeleteOnNode,
    ]
    drop, fail = acts[0], acts[1]
    assert isinstance(drop, own.DropRoute) and drop.deleted
    assert isinstance(fail, own.FailWaiters) and fail.waiters == [w] and fail.reason == "gone"


def test_instance_gone_only_acts_on_a_known_instance() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router()
    r.add_instance(inst(1))
    assert core.instance_gone("f", r, "nope") == []
    assert [type(a) for a in core.instance_gone("f", r, "i1")] == [own.Unrouted, own.ScaleUp]


def test_recovery_rerecords_live_instances_deletes_gone_ones_and_adopts_later() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    acts = core.recover([("f", "i1", "rec1")], [("f", "i2")])
    assert acts == [own.Record("f", "i1", "rec1"), own.Record("f", "i2", None)]
    assert core.take_recovered("f") == ["rec1"]
    assert core.take_recovered("f") == []
