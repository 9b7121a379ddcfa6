"""Starts under way at a handover (``functions/dispatch/ownership.py``):
the waiters they cover stay with the previous owner, so the new owner does
not start instances for them a second time (the surplus starts of
docs/simulator.md's saturation flood)."""

from __future__ import annotations

from controlplane.runtime.clock import ManualClock
from functions.dispatch import ownership as own
from functions.dispatch.policy import FunctionRouter, Instance


def router(concurrency: int = 1, max_scale: int = 100) -> FunctionRouter:
    return FunctionRouter("f", concurrency, max_scale, ManualClock(), lease_prefix="d0:")


def inst(i: int) -> Instance:
    return Instance(f"i{i}", f"a{i}", "n0", 1)


def hand_over(core: own.Ownership[str, str], r: FunctionRouter) -> list[own.Action]:
    acts = core.membership_changed({"f": r}, lambda k: "d1")
    [send] = [a for a in acts if isinstance(a, own.SendInstances)]
    return acts + core.instances_sent(send.handover)


def forwarded(acts: list[own.Action]) -> list[object]:
    return [w.token for a in acts if isinstance(a, own.ForwardWaiters) for w in a.waiters]


def test_waiters_covered_by_starts_under_way_stay_and_are_served_by_them() -> None:
    r = router()
    for t in ("a", "b", "c"):
        r.enqueue(t)
    r.begin_scale_up(r.scale_ups_needed() - 1)  # 2 starts for 3 waiters
    core: own.Ownership[str, str] = own.Ownership()
    acts = hand_over(core, r)
    # Only the waiter no start covers goes to the new owner, whose fresh
    # router starts one instance for it: 2 + 1 starts for 3 requests.
    assert forwarded(acts) == ["c"]
    new = router()
    new.enqueue("c")
    assert new.scale_ups_needed() == 1
    # Each start of the old owner serves a kept waiter there, then leaves
    # with that lease for whoever routes the function now.
    for i, token in ((1, "a"), (2, "b")):
        done, leases = core.start_done("f", r, inst(i))
        [serve] = done
        assert isinstance(serve, own.Serve)
        [(w, g)] = serve.grants
        assert w.token == token and g.instance.instance_id == f"i{i}"
        assert leases == [g.lease_id]
        assert f"i{i}" not in r.instances
    assert r.pending == 0 and not r.waiters


def test_a_start_that_fails_after_the_handover_forwards_what_it_covered() -> None:
    r = router()
    for t in ("a", "b"):
        r.enqueue(t)
    r.begin_scale_up(r.scale_ups_needed())
    core: own.Ownership[str, str] = own.Ownership()
    assert forwarded(hand_over(core, r)) == []
    acts = core.start_failed("f", r, "d1")
    assert forwarded(acts) == ["b"]
    assert [w.token for w in r.waiters] == ["a"]
    # The last one fails too: nothing is left to serve "a" here.
    assert forwarded(core.start_failed("f", r, "d1")) == ["a"]
    assert not r.waiters and r.pending == 0


def test_a_late_start_with_no_waiter_left_goes_on_without_leases() -> None:
    r = router()
    r.enqueue("a")
    r.begin_scale_up(1)
    core: own.Ownership[str, str] = own.Ownership()
    hand_over(core, r)
    [w] = list(r.waiters)
    assert r.cancel(w)  # its caller gave up
    acts, leases = core.start_done("f", r, inst(1))
    assert acts == [] and leases == [] and not r.instances
