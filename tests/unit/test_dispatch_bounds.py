"""Dispatch policy bounds with no I/O (injected clock): a handed-over
instance's leases count before any waiter is served on it, and max_scale
bounds ``live + pending`` whatever path an instance comes in by."""

from __future__ import annotations

import random

from controlplane.runtime.clock import ManualClock
from functions.dispatch import ownership as own
from functions.dispatch.autoscale import autoscale_step, retirable
from functions.dispatch.autoscaling.keepalive import make_keepalive
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.policy import FunctionRouter, Instance


def router(concurrency: int = 2, max_scale: int = 4) -> FunctionRouter:
    return FunctionRouter("f", concurrency, max_scale, ManualClock(), lease_prefix="d1:")


def test_handed_over_leases_are_adopted_before_waiters_are_served() -> None:
    # The previous owner leased both slots of i0; two requests wait at the
    # new owner. Served first, they would take slots already in use.
    core: own.Ownership[str, str] = own.Ownership()
    r = router(concurrency=2)
    waiters = [r.enqueue(k) for k in range(2)]
    grants = r.add_instance(
        Instance("i0", "a0", "n0", 2), leases=core.unreleased(["d0:f/1.x", "d0:f/2.y"])
    )
    assert grants == []
    assert r.instances["i0"].in_flight == 2  # never above its concurrency
    assert list(r.waiters) == waiters
    # A slot the old lease frees goes to the first waiter.
    known, served = core.release(r, "d0:f/1.x")
    assert known and [w for w, _ in served] == waiters[:1]
    assert r.instances["i0"].in_flight == 2


def test_adoption_skips_a_lease_released_before_its_instance_arrived() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router(concurrency=2)
    w = r.enqueue("w")
    core.release(None, "d0:f/1.x")  # overtook the handover
    grants = r.add_instance(
        Instance("i0", "a0", "n0", 2), leases=core.unreleased(["d0:f/1.x", "d0:f/2.y"])
    )
    assert [x for x, _ in grants] == [w]  # one slot was really free
    assert r.instances["i0"].in_flight == 2 and set(r.leases) - {grants[0][1].lease_id} == {
        "d0:f/2.y"
    }


def test_an_instance_handed_over_with_no_room_replaces_a_start_under_way() -> None:
    # The new owner began max_scale starts of its own before the old
    # owner's instance arrived (clients with the new membership came
    # straight to it): the warm instance, with its request, goes live and
    # one start is written off; it lands draining and is retired, idle.
    core: own.Ownership[str, str] = own.Ownership()
    r = router(concurrency=1, max_scale=2)
    for _ in range(2):
        r.enqueue()
    assert r.scale_ups_needed() == 2
    r.begin_scale_up(2)
    r.add_instance(Instance("old0", "a", "n", 1), leases=core.unreleased(["d0:f/1.x"]))
    assert not r.instances["old0"].draining
    assert (r.live_count(), r.pending, r.surplus_starts) == (1, 1, 1)
    for i in range(2):
        r.scale_up_done(Instance(f"new{i}", "a", "n", 1))
        assert r.live_count() + r.pending <= 2
    assert r.live_count() == 2 and retirable(r) == ["new0"]
    # The autoscaling round names it for retirement.
    kpa = KpaAutoscaler(KpaConfig(target_concurrency=1, max_scale=2), make_keepalive("fixed"))
    [d] = autoscale_step(10.0, [("f", r)], lambda _: kpa)
    assert "new0" in d.retire


def test_an_instance_handed_over_with_no_room_and_nothing_starting_serves_only_its_leases() -> None:
    core: own.Ownership[str, str] = own.Ownership()
    r = router(concurrency=2, max_scale=1)
    r.add_instance(Instance("mine", "a", "n", 2))
    r.add_instance(Instance("old0", "a", "n", 2), leases=core.unreleased(["d0:f/1.x"]))
    assert r.live_count() + r.pending == 1 and r.instances["old0"].draining
    assert retirable(r) == []  # its request is still in flight
    for _ in range(3):
        g = r.acquire()
        assert g is None or g.instance.instance_id == "mine"
    core.release(r, "d0:f/1.x")
    assert retirable(r) == ["old0"]


def test_a_start_landing_after_max_scale_was_lowered_is_added_draining() -> None:
    r = router(concurrency=1, max_scale=2)
    r.enqueue()
    r.enqueue()
    r.begin_scale_up(2)
    r.update_spec(concurrency=1, max_scale=1)
    for i in range(2):
        r.scale_up_done(Instance(f"i{i}", "a", "n", 1))
        assert r.live_count() + r.pending <= 1
    # (The first to land found the other still pending: it is the surplus.)
    assert r.live_count() == 1 and sum(i.draining for i in r.instances.values()) == 1


def test_live_plus_pending_never_exceeds_max_scale_on_any_path() -> None:
    # The request path, the autoscaler, handovers, failed and late starts,
    # and releases, interleaved at random.
    rng = random.Random(7)
    for _ in range(30):
        max_scale = rng.randint(1, 6)
        r = router(concurrency=rng.randint(1, 3), max_scale=max_scale)
        core: own.Ownership[str, str] = own.Ownership()
        kpa = KpaAutoscaler(
            KpaConfig(target_concurrency=float(r.concurrency), max_scale=max_scale, min_scale=1),
            make_keepalive("fixed"),
        )
        now, serial, starting = 0.0, 0, 0
        for _ in range(300):
            op = rng.random()
            serial += 1
            if op < 0.3:
                if r.acquire() is None:
                    r.enqueue()
                    n = r.scale_ups_needed()
                    r.begin_scale_up(n)
                    starting += n
            elif op < 0.45 and starting:
                starting -= 1
                if rng.random() < 0.2:
                    r.scale_up_failed()
                else:
                    r.scale_up_done(Instance(f"s{serial}", "a", "n", r.concurrency))
            elif op < 0.55:
                leases = [f"d0:f/{serial}.{k}" for k in range(rng.randint(0, r.concurrency))]
                r.add_instance(
                    Instance(f"h{serial}", "a", "n", r.concurrency), leases=core.unreleased(leases)
                )
            elif op < 0.75 and r.leases:
                r.release(rng.choice(list(r.leases)))
            else:
                now += 2.0
                for d in autoscale_step(now, [("f", r)], lambda _, k=kpa: k):
                    r.begin_scale_up(d.start)
                    starting += d.start
                    for iid in d.retire:
                        r.drain(iid)
                        r.remove_instance(iid)
            assert r.live_count() + r.pending <= max_scale
            assert all(i.in_flight <= i.concurrency for i in r.instances.values())
