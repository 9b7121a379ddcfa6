"""How many starts waiting requests ask for (``FunctionRouter.scale_ups_needed``
with ``StartPace``), with no I/O and an injected clock: starts under way
cover the slots the waiters need; short requests queued behind a slow start
need a fraction of a slot each; a start that fails gives its share back."""

from __future__ import annotations

import random

from controlplane.runtime.clock import ManualClock
from functions.dispatch.autoscale import autoscale_step
from functions.dispatch.autoscaling.keepalive import make_keepalive
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.policy import FunctionRouter, Instance
from functions.dispatch.startneed import StartPace


def router(concurrency: int, max_scale: int, paced: bool = True) -> FunctionRouter:
    return FunctionRouter(
        "f", concurrency, max_scale, ManualClock(), pace=StartPace() if paced else None
    )


def with_history(r: FunctionRouter, start_s: float, service_s: float) -> None:
    """One start that took ``start_s`` and requests of ``service_s`` on its
    instance, which then goes away (its node agent was killed)."""
    clock = r.clock
    assert isinstance(clock, ManualClock)
    r.begin_scale_up(1)
    clock.advance(start_s)
    r.scale_up_done(Instance("i0", "a", "n", r.concurrency))
    for _ in range(5):
        g = r.acquire()
        assert g is not None
        clock.advance(service_s)
        r.release(g.lease_id)
    r.remove_instance("i0")


def queue_one_by_one(r: FunctionRouter, n: int, every_s: float) -> int:
    """n requests arrive ``every_s`` apart and wait; each asks for the
    starts the router says (as Dispatch's request path does). Starts made."""
    clock = r.clock
    assert isinstance(clock, ManualClock)
    made = 0
    for _ in range(n):
        r.enqueue()
        k = r.scale_ups_needed()
        r.begin_scale_up(k)
        made += k
        clock.advance(every_s)
    return made


def test_starts_under_way_cover_concurrency_waiters_each() -> None:
    # 20 waiters, 4 per instance, 2 starting (8 slots): 3 more, not 5.
    r = router(concurrency=4, max_scale=10)
    for _ in range(20):
        r.enqueue()
    r.begin_scale_up(2)
    assert r.scale_ups_needed() == 3
    r.begin_scale_up(3)
    assert r.scale_ups_needed() == 0


def test_short_requests_queued_behind_a_slow_start_ask_for_no_second_start() -> None:
    # A start took 2 s, a request holds its slot 5 ms: the first instance up
    # serves 100 queued requests in a few tens of ms, long before a second
    # start could be ready. Counted as whole slots they asked for max_scale.
    paced, whole = router(8, 4), router(8, 4, paced=False)
    for r in (paced, whole):
        with_history(r, start_s=2.0, service_s=0.005)
    assert queue_one_by_one(paced, 100, every_s=0.1) == 1
    assert queue_one_by_one(whole, 100, every_s=0.1) == 4


def test_requests_in_flight_longer_than_a_start_count_whole_slots() -> None:
    # The history says 5 ms, but the requests now in flight have held every
    # slot for 3 s (their callers keep them): the waiters are no short
    # requests; counted as such they would wait for slots that do not free.
    r = router(concurrency=1, max_scale=20)
    with_history(r, start_s=2.0, service_s=0.005)
    r.add_instance(Instance("busy", "a", "n", 1))
    assert r.acquire() is not None
    assert isinstance(r.clock, ManualClock)
    r.clock.advance(3.0)
    assert queue_one_by_one(r, 10, every_s=0.0) == 10


def test_requests_longer_than_a_start_count_whole_slots() -> None:
    r = router(concurrency=4, max_scale=10)
    with_history(r, start_s=1.0, service_s=5.0)
    assert queue_one_by_one(r, 20, every_s=0.0) == 5


def test_with_no_history_every_waiter_counts_a_whole_slot() -> None:
    r = router(concurrency=2, max_scale=10)
    assert queue_one_by_one(r, 10, every_s=0.1) == 5


def test_a_failed_start_gives_its_share_back_and_its_waiters_a_replacement() -> None:
    r = router(concurrency=8, max_scale=4)
    for _ in range(16):
        r.enqueue()
    assert r.scale_ups_needed() == 2
    r.begin_scale_up(2)
    assert r.scale_up_failed() == []  # the other start still covers some
    assert r.scale_ups_needed() == 1  # the failed one's 8 waiters: a replacement
    # The last one failing with nothing running fails every waiter instead.
    r.begin_scale_up(1)
    r.scale_up_failed()
    assert len(r.scale_up_failed()) == 16 and not r.waiters


def test_an_expired_lease_or_a_failed_start_is_not_a_sample() -> None:
    clock = ManualClock()
    r = FunctionRouter("f", 1, 2, clock, lease_ttl_s=10.0, pace=StartPace())
    r.begin_scale_up(2)
    clock.advance(3.0)
    r.scale_up_failed()
    assert r.pace is not None and r.pace.start_s == 0.0
    r.scale_up_done(Instance("i0", "a", "n", 1))
    assert r.pace.start_s == 3.0
    r.acquire()
    clock.advance(11.0)
    r.expire_leases()
    assert r.pace.service_s == 0.0


def test_the_autoscaler_sees_the_same_demand() -> None:
    # The agent kill again, one autoscaler round later: one start under way,
    # 20 short requests waiting. Counted as whole slots the KPA (panic: the
    # queue appeared at once) starts 2 more; as slots of 5 ms in a 2 s start,
    # the start under way covers them.
    starts = {}
    for paced in (True, False):
        r = router(8, 4, paced=paced)
        with_history(r, start_s=2.0, service_s=0.005)
        r.begin_scale_up(1)
        for _ in range(20):
            r.enqueue()
        cfg = KpaConfig(target_concurrency=8.0, max_scale=4, tick_s=2.0)
        kpa = KpaAutoscaler(cfg, make_keepalive("fixed"))
        [d] = autoscale_step(r.clock.now(), [("f", r)], lambda _, k=kpa: k)
        starts[paced] = d.start
    assert starts == {True: 0, False: 2}


def test_no_waiter_is_left_with_nothing_starting_or_running_for_it() -> None:
    # Arrivals, releases, and starts that end ready or failed, interleaved
    # at random; Dispatch asks for starts at each arrival and after each
    # failed start. Waiters always have a start under way or an instance
    # (busy: a release serves them) for them; after a failed start, what
    # they need is covered again unless max_scale stops it.
    rng = random.Random(11)
    for _ in range(40):
        r = router(concurrency=rng.randint(1, 4), max_scale=rng.randint(1, 5))
        clock = r.clock
        assert isinstance(clock, ManualClock)
        serial = 0

        for _ in range(300):
            op, serial = rng.random(), serial + 1
            clock.advance(rng.random() * 0.5)
            if op < 0.4:
                if r.acquire() is None:
                    r.enqueue()
                    r.begin_scale_up(r.scale_ups_needed())
            elif op < 0.6 and r.pending:
                if rng.random() < 0.3:
                    r.scale_up_failed()
                    r.begin_scale_up(r.scale_ups_needed())
                    need = r.pace.slots_for(len(r.waiters)) if r.pace else 0
                    covered = r.pending * r.concurrency + sum(i.free for i in r.instances.values())
                    assert need <= covered or r.live_count() + r.pending == r.max_scale
                else:
                    r.scale_up_done(Instance(f"s{serial}", "a", "n", r.concurrency))
            elif r.leases:
                r.release(rng.choice(list(r.leases)))
            if r.waiters:
                assert r.pending + r.live_count() > 0
