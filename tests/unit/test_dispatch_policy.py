"""Dispatch policy: instance choice, queueing, coalescing, leases (no gRPC)."""

import pytest

from controlplane.runtime.clock import ManualClock
from functions.dispatch.ownership import handover
from functions.dispatch.policy import FunctionRouter, Instance, QueueFull


def router(concurrency=2, max_scale=3, **kw):
    return FunctionRouter("f", concurrency, max_scale, ManualClock(), **kw)


def inst(i, c=2):
    return Instance(f"i{i}", f"127.0.0.1:{9000 + i}", "n0", c)


def test_no_instance_means_no_grant_and_one_coalesced_scale_up():
    r = router(concurrency=2)
    assert r.acquire() is None
    waiters = [r.enqueue(token=k) for k in range(2)]
    assert r.scale_ups_needed() == 1  # two requests fit one instance
    r.begin_scale_up(1)
    assert r.scale_ups_needed() == 0  # coalesced: the start under way covers them
    grants = r.scale_up_done(inst(0))
    assert [w for w, _ in grants] == waiters
    assert all(g.cold_start for _, g in grants)
    assert r.pending == 0


def test_burst_beyond_concurrency_starts_more_instances_up_to_max_scale():
    r = router(concurrency=2, max_scale=3)
    for _ in range(10):
        r.enqueue()
    assert r.scale_ups_needed() == 3  # ceil(10/2)=5 capped by max_scale
    r.begin_scale_up(3)
    assert r.scale_ups_needed() == 0


def test_least_loaded_choice_and_slot_accounting():
    r = router(concurrency=2)
    r.add_instance(inst(0))
    r.add_instance(inst(1))
    g1, g2 = r.acquire(), r.acquire()
    assert {g1.instance.instance_id, g2.instance.instance_id} == {"i0", "i1"}
    r.acquire(), r.acquire()
    assert r.acquire() is None  # 2 instances x 2 slots used
    known, grants = r.release(g1.lease_id)
    assert known and grants == []
    assert r.acquire().instance.instance_id == g1.instance.instance_id


def test_release_hands_slot_to_first_waiter_in_order_not_cold():
    r = router(concurrency=1, max_scale=1)
    r.add_instance(inst(0, c=1))
    g = r.acquire()
    w1, w2 = r.enqueue("a"), r.enqueue("b")
    assert r.scale_ups_needed() == 0  # at max_scale: queue instead
    _, grants = r.release(g.lease_id)
    assert [(w, gr.cold_start) for w, gr in grants] == [(w1, False)]
    assert list(r.waiters) == [w2]
    assert r.release(g.lease_id) == (False, [])  # idempotent


def test_new_request_does_not_jump_the_queue():
    r = router(concurrency=1, max_scale=1)
    r.add_instance(inst(0, c=1))
    g = r.acquire()
    r.enqueue()
    r.leases.pop(g.lease_id)  # simulate a freed slot without serving waiters
    r.instances["i0"].in_flight = 0
    assert r.acquire() is None


def test_failed_scale_up_fails_waiters_only_when_nothing_can_serve_them():
    r = router()
    ws = [r.enqueue() for _ in range(3)]
    r.begin_scale_up(2)
    assert r.scale_up_failed() == []  # one start still under way
    assert r.scale_up_failed() == ws
    assert not r.waiters and all(w.done for w in ws)


def test_cancel_removes_waiter_and_is_false_once_served():
    r = router()
    w = r.enqueue()
    assert r.cancel(w) and not r.waiters
    w2 = r.enqueue()
    r.add_instance(inst(0))
    assert not r.cancel(w2)


def test_leases_expire_by_the_injected_clock():
    clock = ManualClock()
    r = FunctionRouter("f", 1, 1, clock, lease_ttl_s=10)
    r.add_instance(inst(0, c=1))
    r.acquire()
    w = r.enqueue()
    clock.advance(9.9)
    assert r.expire_leases() == []
    clock.advance(0.2)
    grants = r.expire_leases()
    assert [x for x, _ in grants] == [w]


def test_remove_and_drain_stop_routing():
    r = router(concurrency=1)
    r.add_instance(inst(0, c=1))
    r.add_instance(inst(1, c=1))
    assert r.drain("i0")
    assert r.acquire().instance.instance_id == "i1"
    assert r.live_count() == 1
    r.remove_instance("i1")
    assert r.acquire() is None and not r.leases


def test_queue_limit():
    r = router(max_queue=2)
    r.enqueue(), r.enqueue()
    with pytest.raises(QueueFull, match="limit 2"):
        r.enqueue()


def test_add_instance_is_idempotent():
    r = router()
    r.add_instance(inst(0))
    r.add_instance(inst(0))
    assert len(r.instances) == 1


def test_update_spec_raises_concurrency_and_serves_waiters():
    r = router(concurrency=1, max_scale=1)
    r.add_instance(inst(0, c=1))
    r.acquire()
    w = r.enqueue()
    grants = r.update_spec(concurrency=2, max_scale=1)
    assert [x for x, _ in grants] == [w]


def test_handover_carries_active_leases_to_the_new_owner():
    old = router(concurrency=2)
    old.add_instance(inst(0))
    g = old.acquire()
    moved = handover(old)
    assert [(i.instance_id, leases) for i, leases in moved] == [("i0", [g.lease_id])]
    new = router(concurrency=2)
    i0 = moved[0][0]
    new.add_instance(
        Instance(i0.instance_id, i0.address, i0.node_id, i0.concurrency), leases=moved[0][1]
    )
    assert new.instances["i0"].in_flight == 1
    new.acquire()
    assert new.acquire() is None  # the adopted lease still counts
    assert new.release(g.lease_id)[0]
