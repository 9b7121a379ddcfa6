"""Capacity credits, both pure sides with an injected clock and no I/O:
the grant side (``functions.schedule.credits.CreditLedger`` over a real
``PlacementPolicy``) and the use side (``functions.dispatch.credits.CreditWallet``),
and the two driven together against real node bookkeeping (``NodeCapacity``)."""

from __future__ import annotations

import random

from controlplane.nodeagent.capacity import NodeCapacity
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.errors import ResourceExhausted
from controlplane.runtime.resources import Res
from functions.dispatch.credits import CreditWallet
from functions.schedule.credits import CreditLedger, Grant, Use
from functions.schedule.model import NodeInfo, Reservation
from functions.schedule.policy import PlacementPolicy

CAP = Res(4000, 8192)
SLICE = Res(1000, 2048)
SMALL = Res(300, 256)


def policy(clock: ManualClock, nodes: int = 3) -> PlacementPolicy:
    p = PlacementPolicy("s1", clock=clock, rng=random.Random(7))
    for i in range(nodes):
        p.upsert(NodeInfo(f"n{i}", f"agent-{i}", CAP, Res(), 1, 0))
    return p


def ledger(clock: ManualClock, p: PlacementPolicy, per: int = 2) -> CreditLedger:
    return CreditLedger(p, slice=SLICE, ttl_s=10.0, grace_s=2.0, max_per_holder=per, clock=clock)


def free_total(p: PlacementPolicy) -> Res:
    total = Res()
    for n in p.nodes():
        total = total + p.free(n.node_id)
    return total


# ----- grant side -------------------------------------------------------------


def test_grant_holds_the_slice_as_allocated_and_bounds_each_holder() -> None:
    clock = ManualClock()
    p = policy(clock)
    led = ledger(clock, p, per=2)
    before = free_total(p)
    grants = led.sync("d1", want=5)
    assert len(grants) == 2  # the bound, not the ask
    assert len({g.node_id for g in grants}) == 2  # distinct nodes
    assert all(g.resources == SLICE and g.ttl_s == 10.0 for g in grants)
    assert free_total(p) == before - SLICE - SLICE
    assert led.sync("d1", want=1) == []  # still at its bound
    assert len(led.sync("d2", want=1)) == 1  # another holder has its own


def test_use_becomes_an_exact_allocation_and_return_frees_the_rest() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=1)
    led = ledger(clock, p)
    (g,) = led.sync("d1", want=1)
    assert p.free("n0") == CAP - SLICE
    led.sync("d1", used=[Use(g.credit_id, SMALL, node_seq=2)])
    assert p.free("n0") == CAP - SLICE  # used part confirmed, rest still held
    led.sync("d1", returned=[(g.credit_id, False)])
    assert p.free("n0") == CAP - SMALL  # only the instance stays allocated
    # The node's status that counts the instance settles it: no double count.
    p.upsert(NodeInfo("n0", "agent-0", CAP, SMALL, 2, 1))
    assert p.free("n0") == CAP - SMALL
    assert led.stats["used"] == 1 and led.stats["returned"] == 1 and len(led) == 0


def test_reports_of_unknown_or_foreign_credits_change_nothing() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=1)
    led = ledger(clock, p)
    (g,) = led.sync("d1", want=1)
    free = p.free("n0")
    led.sync("d2", used=[Use(g.credit_id, SMALL, 2)], returned=[(g.credit_id, False)])
    led.sync("d1", used=[Use("s1/999", SMALL, 2)])
    assert p.free("n0") == free and len(led) == 1


def test_expiry_releases_the_hold_after_the_grace() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=1)
    led = ledger(clock, p)
    led.sync("d1", want=1)
    clock.advance(11.0)  # past the holder's ttl, within the grace
    assert led.expire() == 0 and p.free("n0") == CAP - SLICE
    clock.advance(1.5)
    assert led.expire() == 1 and p.free("n0") == CAP


def test_refused_return_puts_the_node_in_doubt() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=1)
    led = ledger(clock, p)
    (g,) = led.sync("d1", want=1)
    led.sync("d1", returned=[(g.credit_id, True)])
    assert led.stats["refused"] == 1
    # In doubt: the next placement on that node must probe first.
    pl = p.begin(SMALL)
    step = p.advance(pl)
    assert not isinstance(step, Reservation)


def test_membership_change_drops_credits_on_nodes_that_left() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=2)
    led = ledger(clock, p)
    grants = led.sync("d1", want=2)
    gone = grants[0].node_id
    p.retain(lambda nid: nid != gone)
    assert led.retain() == [grants[0].credit_id]
    assert len(led) == 1 and led.drop_holder("d1") == 1 and len(led) == 0


def test_no_grant_unless_a_node_keeps_a_slice_free_beside_it() -> None:
    clock = ManualClock()
    p = policy(clock, nodes=1)
    p.upsert(NodeInfo("n0", "agent-0", CAP, Res(2500, 0), 2, 1))  # 1.5 slices free
    assert ledger(clock, p).sync("d1", want=1) == []
    p.upsert(NodeInfo("n0", "agent-0", CAP, Res(2000, 0), 3, 1))  # 2 slices free
    assert len(ledger(clock, p).sync("d1", want=1)) == 1
    assert p.free("n0") == CAP - Res(2000, 0) - SLICE


def test_no_credit_larger_than_a_quarter_of_its_node() -> None:
    clock = ManualClock()
    p = PlacementPolicy("s1", clock=clock, rng=random.Random(7))
    p.upsert(NodeInfo("n0", "agent-0", Res(2000, 8192), Res(), 1, 0))
    assert ledger(clock, p).sync("d1", want=1) == []
    assert p.free("n0") == Res(2000, 8192)  # nothing left held


# ----- use side -----------------------------------------------------------------


def grant(cid: str, node: str = "n0", res: Res = SLICE, ttl: float = 10.0) -> Grant:
    return Grant(cid, node, f"agent-{node}", res, ttl)


def wallet(clock: ManualClock, target: int = 2) -> CreditWallet:
    w = CreditWallet(target=target, renew_s=1.0, idle_s=30.0, clock=clock)
    w.home = "s1"  # where new credits are asked (``due`` sets it too)
    return w


def fill(w: CreditWallet, *grants: Grant) -> None:
    req = w.begin_sync("s1")
    w.end_sync(req, list(grants))


def test_take_misses_without_credits_and_asks_for_a_refill() -> None:
    clock = ManualClock()
    w = wallet(clock)
    assert w.due() == []  # idle: asks for nothing
    assert w.take(SMALL) is None
    assert w.due("s1", upkeep=False) == ["s1"]
    req = w.begin_sync("s1")
    assert req.want == 2
    assert w.due("s1") == []  # one exchange in flight per grantor
    w.end_sync(req, [grant("a"), grant("b", "n1")])
    use = w.take(SMALL)
    assert use is not None and use.credit.left == SLICE - SMALL
    assert w.stats["hits"] == 1 and w.stats["misses"] == 1


def test_take_spreads_over_credits_and_never_uses_one_twice_beyond_its_slice() -> None:
    clock = ManualClock()
    w = wallet(clock, target=2)
    w.take(SMALL)  # active
    fill(w, grant("a"), grant("b", "n1"))
    a = w.take(SMALL)
    b = w.take(SMALL)
    assert a is not None and b is not None and a.node_id != b.node_id
    # Every use taken from a credit fits in its slice together.
    uses = [u for u in (w.take(SMALL) for _ in range(20)) if u is not None] + [a, b]
    for cid in ("a", "b"):
        total = Res()
        for u in uses:
            if u.credit.credit_id == cid:
                total = total + u.need
        assert total.fits_in(SLICE)


def test_a_burst_goes_to_the_credit_with_the_fewest_starts_in_flight() -> None:
    clock = ManualClock()
    w = wallet(clock, target=2)
    w.take(SMALL)
    fill(w, grant("a"), grant("b", "n1"))
    first = w.take(Res(100, 64))
    assert first is not None
    second = w.take(Res(100, 64))  # the other credit, though the first has less left
    assert second is not None and second.node_id != first.node_id
    w.settled(first, 2)
    third = w.take(Res(100, 64))
    assert third is not None and third.node_id == first.node_id  # none in flight there now


def test_a_bound_on_starts_in_flight_per_credit_sends_the_rest_elsewhere() -> None:
    clock = ManualClock()
    w = CreditWallet(target=1, max_starting=2, clock=clock)
    w.home = "s1"
    w.take(SMALL)
    fill(w, grant("a"))
    assert w.take(Res(100, 64)) is not None and w.take(Res(100, 64)) is not None
    assert w.take(Res(100, 64)) is None  # two in flight on that node: Schedule places it


def test_a_spent_credit_goes_back_with_its_uses_and_is_refilled() -> None:
    clock = ManualClock()
    w = wallet(clock, target=1)
    w.take(SMALL)
    fill(w, grant("a"))
    uses = [w.take(SMALL) for _ in range(3)]  # 900m of 1000m: spent for 300m
    assert all(u is not None for u in uses)
    assert w.take(SMALL) is None
    for i, u in enumerate(uses):
        assert u is not None
        w.settled(u, node_seq=10 + i)
    req = w.begin_sync("s1")
    assert [x.node_seq for x in req.used] == [10, 11, 12]
    assert req.returned == [("a", False)] and req.want == 1


def test_a_start_refused_for_room_is_retried_while_remainders_are_not_back() -> None:
    clock = ManualClock()
    w = CreditWallet(target=1, room_retries=2, clock=clock)
    w.home = "s1"
    assert not w.room_retry(0)  # nothing held: no room will come back from here
    w.take(SMALL)
    fill(w, grant("a"))
    uses = [w.take(SMALL) for _ in range(3)]  # 900m of 1000m: 100m stranded
    for i, u in enumerate(uses):
        assert u is not None
        assert not w.room_retry(0)  # starts still in flight on it: nothing to return yet
        w.settled(u, node_seq=10 + i)
    assert w.returns_pending() and w.returns_outstanding()
    assert w.room_retry(0) and w.room_retry(1) and not w.room_retry(2)
    w.return_all()  # as the caller does before the retry (``Peers.return_credits``)
    assert w.due(upkeep=True) == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("a", False)]
    assert not w.returns_pending() and w.returns_outstanding()  # in flight
    assert w.room_retry(0)
    w.end_sync(req, [])
    assert not w.returns_outstanding() and not w.room_retry(0)


def test_a_failed_exchange_leaves_no_return_outstanding() -> None:
    clock = ManualClock()
    w = CreditWallet(target=1, clock=clock)
    w.home = "s1"
    w.take(SMALL)
    fill(w, grant("a"))
    u = w.take(SMALL)
    assert u is not None
    w.settled(u, None, refused=True)
    req = w.begin_sync("s1")
    w.end_sync(req, None)  # the grantor is gone, and its holds with it
    assert not w.returns_outstanding()


def test_refused_create_returns_the_credit_marked_refused() -> None:
    clock = ManualClock()
    w = wallet(clock)
    w.take(SMALL)
    fill(w, grant("a"))
    use = w.take(SMALL)
    assert use is not None
    w.settled(use, None, refused=True)
    assert w.take(SMALL) is None  # the credit is gone
    req = w.begin_sync("s1")
    assert req.returned == [("a", True)] and req.used == []


def test_credits_near_expiry_or_of_an_idle_holder_go_back() -> None:
    clock = ManualClock()
    w = wallet(clock, target=2)
    w.take(SMALL)
    fill(w, grant("a", ttl=5.0), grant("b", "n1", ttl=20.0))
    clock.advance(4.5)  # a is within renew_s of its expiry
    use = w.take(SMALL)
    assert use is not None and use.credit.credit_id == "b"
    w.settled(use, 5)
    assert w.due() == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("a", False)] and req.want == 1 and len(req.used) == 1
    w.end_sync(req, [])
    clock.advance(31.0)  # idle
    assert w.due() == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("b", False)] and req.want == 0


def test_upkeep_replaces_credits_before_a_take_would_find_them_expired() -> None:
    clock = ManualClock()
    w = wallet(clock, target=1)
    w.take(SMALL)
    fill(w, grant("a", ttl=5.0))
    clock.advance(3.5)  # within 2 x renew_s: upkeep renews, a take still uses it
    assert w.due(upkeep=False) == []
    assert w.due() == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("a", False)] and req.want == 1
    w.end_sync(req, [grant("b", "n1", ttl=5.0)])
    use = w.take(SMALL)
    assert use is not None and use.credit.credit_id == "b"


def test_membership_change_and_a_lost_grantor_drop_credits() -> None:
    clock = ManualClock()
    w = wallet(clock)
    w.take(SMALL)
    fill(w, grant("a"), grant("b", "n1"))
    assert w.drop(lambda c: c.node_id != "n0") == 1
    use = w.take(SMALL)
    assert use is not None and use.node_id == "n1"
    w.settled(use, 3)
    req = w.begin_sync("s1")
    w.end_sync(req, None)  # the grantor did not answer: its holds are gone
    assert w.credits() == [] and w.take(SMALL) is None


# ----- both sides together ------------------------------------------------------------


def test_credits_never_over_commit_a_node_and_the_view_is_exact_afterwards() -> None:
    """A burst served from credits on one small node, with a Schedule
    placement racing them: the agent's ledger refuses what does not fit, and
    once everything is reported and returned Schedule's view equals the
    agent's allocation."""
    clock = ManualClock()
    cap = CAP
    p = PlacementPolicy("s1", clock=clock, rng=random.Random(1))
    p.upsert(NodeInfo("n0", "agent-0", cap, Res(), 1, 0))
    agent = NodeCapacity(cap, "n0")
    led = ledger(clock, p, per=1)
    w = wallet(clock, target=1)
    w.take(SMALL)
    req = w.begin_sync("s1")
    w.end_sync(req, led.sync("d1", req.used, req.returned, req.want))
    seq = 1
    made = 0
    for i in range(10):
        use = w.take(SMALL)
        if use is None:
            continue
        try:
            agent.allocate(f"c{i}", use.need)
        except ResourceExhausted:
            w.settled(use, None, refused=True)
            continue
        seq += 1
        made += 1
        w.settled(use, seq)
    # Schedule places the rest of the node meanwhile, from its view.
    pl = p.begin(Res(3000, 1024))
    step = p.advance(pl)
    assert isinstance(step, Reservation)
    agent.allocate("s", step.need)
    seq += 1
    p.confirm(step, seq)
    assert agent.allocated.fits_in(cap)
    for wait in (1.0, 31.0):  # the upkeep tick reports; idle, everything goes back
        clock.advance(wait)
        for g in w.due():
            req = w.begin_sync(g)
            w.end_sync(req, led.sync("d1", req.used, req.returned, req.want))
    assert len(led) == 0 and made == 3 and led.stats["used"] == 3
    assert p.free("n0") == cap - agent.allocated
