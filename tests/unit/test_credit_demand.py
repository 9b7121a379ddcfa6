"""How many credits a Dispatch instance holds (``CreditDemand``) and when
its spent credits go back (``CreditWallet``): pure, with a manual clock."""

from __future__ import annotations

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.credits import Grant
from controlplane.runtime.resources import Res
from functions.dispatch.credit_demand import CreditDemand
from functions.dispatch.credits import CreditWallet

SLICE = Res(1000, 2048)
START = Res(250, 128)  # four to a slice


def _wallet(clock: ManualClock, *, target: int = 4, floor: int = 1) -> CreditWallet:
    w = CreditWallet(target=target, floor=floor, shrink_s=10.0, renew_s=1.0, clock=clock)
    w.home = "s1"
    return w


def _fill(w: CreditWallet, *cids: str, ttl: float = 30.0) -> list[Grant]:
    req = w.begin_sync("s1")
    grants = [Grant(c, f"n-{c}", f"agent-{c}", SLICE, ttl) for c in cids]
    w.end_sync(req, grants)
    return grants


def test_the_count_starts_at_the_floor_and_a_miss_takes_it_to_the_ceiling() -> None:
    clock = ManualClock()
    d = CreditDemand(floor=1, ceiling=4, shrink_s=10.0, clock=clock)
    assert d.target() == 1
    d.took(hit=True, room_left=True)
    assert d.target() == 1  # starts the credits held keep up with: no more
    d.took(hit=False, room_left=False)
    assert d.target() == 4 and d.stats["grew"] == 1


def test_it_comes_down_one_credit_per_shrink_period_to_the_floor() -> None:
    clock = ManualClock()
    d = CreditDemand(floor=1, ceiling=4, shrink_s=10.0, clock=clock)
    d.took(hit=False, room_left=False)
    seen = []
    for _ in range(5):
        clock.advance(10.0)
        seen.append(d.target())
    assert seen == [3, 2, 1, 1, 1] and d.stats["shrank"] == 3
    # A take that used up the room held asks one more, at once.
    d.took(hit=True, room_left=False)
    assert d.target() == 2
    clock.advance(9.0)
    d.took(hit=False, room_left=False)  # a miss restarts the period too
    clock.advance(9.0)
    assert d.target() == 4


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        CreditDemand(floor=-1)
    with pytest.raises(ValueError):
        CreditDemand(shrink_s=0.0)
    assert CreditDemand(floor=8, ceiling=2).target() == 2  # the floor is capped


class _Grantor:
    """Grants every credit asked (a ledger with room to spare), counting."""

    def __init__(self) -> None:
        self.n = 0
        self.exchanges = 0
        self.wants: list[int] = []

    def sync(self, w: CreditWallet, grantor: str) -> None:
        req = w.begin_sync(grantor)
        self.exchanges += 1
        self.wants.append(req.want)
        grants = []
        for _ in range(req.want):
            self.n += 1
            grants.append(Grant(f"c{self.n}", f"n{self.n}", f"agent-{self.n}", SLICE, 30.0))
        w.end_sync(req, grants)


def _run(w: CreditWallet, g: _Grantor, clock: ManualClock, seconds: int, start_every: int) -> None:
    """A start every ``start_every`` s (settled at once), the upkeep every
    second, every exchange due answered at once."""
    for t in range(seconds):
        clock.advance(1.0)
        if t % start_every == 0:
            use = w.take(START)
            for grantor in w.due("s1", upkeep=False):
                g.sync(w, grantor)
            if use is not None:
                w.settled(use, node_seq=t)
        for grantor in w.due(upkeep=True):
            g.sync(w, grantor)


def test_at_a_low_start_rate_the_wallet_holds_the_floor_not_the_target() -> None:
    runs = {}
    for floor in (2, 4):  # 4: a fixed count, as before the demand rule
        clock = ManualClock()
        w = _wallet(clock, target=4, floor=floor)
        g = _Grantor()
        _run(w, g, clock, 300, start_every=5)  # 0.2 starts/s, four to a credit
        assert g.wants[0] == 4  # the first start found none: the target at once
        assert w.stats["misses"] == 1 and w.stats["hits"] == 59
        runs[floor] = (len([c for c in w.credits() if not c.retired]), g.n, g.exchanges)
    held, granted, exchanges = runs[2]
    assert held == 2
    # Four credits are renewed every 30 s whether used or not (~1.5 starts
    # each here); two are spent about as often as they expire. (Here the
    # four were granted together and so renewed in one exchange each time;
    # in a run they come and go at different times.)
    assert granted < 0.6 * runs[4][1] and exchanges <= runs[4][2], runs


def test_a_spent_credit_goes_back_with_the_next_exchange_not_one_of_its_own() -> None:
    clock = ManualClock()
    w = _wallet(clock, target=1)
    w.take(START)
    _fill(w, "a")
    uses = [w.take(START) for _ in range(4)]  # spent: a refill goes at once
    req = w.begin_sync("s1")
    assert req.want == 1 and req.returned == []  # its starts are not settled yet
    w.end_sync(req, [Grant("b", "n-b", "agent-b", SLICE, 60.0)])
    for i, u in enumerate(uses):
        assert u is not None
        w.settled(u, node_seq=10 + i)
    assert w.returns_pending()
    clock.advance(1.0)
    # Upkeep: the return alone is no exchange yet (was one per spent credit).
    assert w.due(upkeep=True) == []
    clock.advance(27.0)  # 2 * renew_s before a's expiry (30 s): it would go unspent now
    assert w.due(upkeep=True) == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("a", False)] and [u.node_seq for u in req.used] == [10, 11, 12, 13]


def test_a_spent_credit_rides_the_next_exchange_or_goes_when_room_is_wanted() -> None:
    clock = ManualClock()
    w = _wallet(clock, target=1)
    w.take(START)
    _fill(w, "a")
    uses = [w.take(START) for _ in range(4)]
    w.end_sync(w.begin_sync("s1"), [Grant("b", "n-b", "agent-b", SLICE, 30.0)])
    for u in uses:
        assert u is not None
        w.settled(u, node_seq=3)
    assert w.returns_pending() and w.due(upkeep=True) == []
    w.return_all()  # Schedule refused a start for room: the remainders go back now
    assert w.due(upkeep=True) == ["s1"]
    req = w.begin_sync("s1")
    assert req.returned == [("a", False)]
    w.end_sync(req, [])
    # Without that, the next exchange with the grantor (a refill) takes it.
    clock.advance(1.0)
    for u in [w.take(START) for _ in range(4)]:  # b spent: a refill is due
        assert u is not None
        w.settled(u, node_seq=4)
    assert w.due("s1", upkeep=False) == ["s1"]
    req = w.begin_sync("s1")
    assert req.want >= 1 and req.returned == [("b", False)]


def test_a_refused_credit_goes_back_at_the_next_upkeep() -> None:
    clock = ManualClock()
    w = _wallet(clock, target=1)
    w.take(START)
    _fill(w, "a")
    use = w.take(START)
    assert use is not None
    w.settled(use, None, refused=True)  # the agent said full: the grantor's view is off
    assert w.due(upkeep=True) == ["s1"]
    assert w.begin_sync("s1").returned == [("a", True)]


def test_a_burst_asks_for_more_credits_as_every_held_one_gets_a_start_in_flight() -> None:
    """Small starts never use up a slice, but a burst queues behind as many
    sandbox creators as credits held: once each held credit has a start in
    flight, one more is asked, up to the target."""
    clock = ManualClock()
    w = _wallet(clock, target=4, floor=2)
    g = _Grantor()
    _run(w, g, clock, 60, start_every=5)  # at the floor by now
    assert w.demand.target() == 2
    tiny = Res(10, 16)  # a hundred to a slice
    first = w.take(tiny)
    assert w.demand.target() == 2  # the other credit is free: it can take the next
    second = w.take(tiny)
    assert first is not None and second is not None and first.node_id != second.node_id
    assert w.demand.target() == 3  # both creating: the next would queue
    for grantor in w.due("s1", upkeep=False):
        g.sync(w, grantor)
    third = w.take(tiny)
    assert third is not None and third.node_id not in (first.node_id, second.node_id)
