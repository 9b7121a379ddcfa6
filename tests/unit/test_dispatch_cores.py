"""The pure cores Dispatch and the simulator both drive: what happens to an
arriving instance (functions/dispatch/arrivals.py) and the work of a
membership change, in order (functions/dispatch/memberchange.py)."""

from __future__ import annotations

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.credits import Grant
from controlplane.runtime.resources import Res
from functions.dispatch import arrivals, memberchange
from functions.dispatch import ownership as own
from functions.dispatch.credits import CreditWallet
from functions.dispatch.policy import FunctionRouter, Instance


def _router(name: str = "f", max_scale: int = 4) -> FunctionRouter:
    return FunctionRouter(name, 1, max_scale, ManualClock(), lease_prefix="d0:")


def test_a_start_for_the_current_router_joins_it_as_a_cold_start() -> None:
    r = _router()
    a = arrivals.decide(r, r, None, cold=True)
    assert (a.late, a.owner, a.route, a.cold, a.delete) == (False, None, r, True, False)


def test_a_start_whose_function_moved_serves_its_waiters_then_goes_to_the_owner() -> None:
    started = _router()
    a = arrivals.decide(started, None, "d1", cold=True)
    assert (a.late, a.owner, a.route, a.delete) == (True, "d1", None, False)


def test_a_start_whose_function_was_deleted_is_stopped() -> None:
    a = arrivals.decide(_router(), None, None, cold=True)
    assert a.delete and not a.late


def test_a_start_whose_function_was_redeployed_joins_the_new_router_not_as_a_cold_start() -> None:
    started, current = _router(), _router()
    a = arrivals.decide(started, current, None, cold=True)
    assert (a.late, a.route, a.cold) == (True, current, False)


def test_a_handed_over_instance_is_not_late() -> None:
    started = _router()
    assert not arrivals.decide(started, None, "d1", cold=False).late


def test_join_serves_a_waiter_and_ends_the_start() -> None:
    r = _router()
    w = r.enqueue("token")
    r.begin_scale_up(1)
    new, grants = arrivals.join(r, Instance("i0", "a:1", "n0", 1), cold=True, leases=None)
    assert new and r.pending == 0
    assert [x.token for x, _ in grants] == [w.token]


def test_a_repeated_arrival_only_ends_its_start() -> None:
    r = _router()
    r.begin_scale_up(2)
    arrivals.join(r, Instance("i0", "a:1", "n0", 1), cold=True, leases=None)
    new, grants = arrivals.join(r, Instance("i0", "a:1", "n0", 1), cold=True, leases=None)
    assert not new and not grants
    assert r.pending == 0 and len(r.instances) == 1


def test_a_membership_change_drops_moved_credits_and_hands_over_moved_functions() -> None:
    wallet = CreditWallet(target=2, clock=ManualClock())
    req = wallet.begin_sync("s1")
    wallet.end_sync(req, [Grant("c1", "n1", "agent-1", Res(1000, 1024), 10.0),
                          Grant("c2", "n2", "agent-2", Res(1000, 1024), 10.0)])  # fmt: skip
    r = _router()
    r.add_instance(Instance("i0", "a:1", "n0", 1))
    core: own.Ownership[str, str] = own.Ownership()
    work = memberchange.membership_changed(
        core, {"f": r, "g": _router("g")}, lambda fn: "d1" if fn == "f" else None,
        wallet, lambda c: c.node_id == "n1",
    )  # fmt: skip
    assert work.refill
    assert [c.node_id for c in wallet.credits()] == ["n1"]
    kinds = [type(x).__name__ for x in work.actions]
    assert kinds == ["DropRoute", "Unrouted", "SendInstances"]
    assert all(x.function == "f" for x in work.actions)


def test_nothing_moved_asks_no_refill() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    work = memberchange.membership_changed(core, {"f": _router()}, lambda fn: None, None, bool)
    assert not work.refill and not work.actions
