"""FunctionRouter's instance index and totals against brute-force scans.

The router keeps a heap of the instances with a free slot and running
totals (free slots, draining instances, requests in flight) instead of
scanning its instances per request. Random operation sequences check that
every choice and every total equals what a scan of the instances gives.
"""

import random

import pytest

from controlplane.runtime.clock import ManualClock
from functions.dispatch.policy import FunctionRouter, Instance


def scan_least_loaded(r: FunctionRouter) -> Instance | None:
    """The original definition: least in flight among instances with a free
    slot, ties to the first in insertion order."""
    best = None
    for inst in r.instances.values():
        if inst.free > 0 and (best is None or inst.in_flight < best.in_flight):
            best = inst
    return best


def check_totals(r: FunctionRouter) -> None:
    insts = list(r.instances.values())
    assert r._slots_free == sum(i.free for i in insts)
    assert r.live_count() == sum(1 for i in insts if not i.draining)
    assert r.load() == sum(i.in_flight for i in insts) + len(r.waiters)


def random_walk(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    r = FunctionRouter("f", rng.choice([1, 1, 2, 3]), 50, clock, lease_ttl_s=30.0)
    leases: list[str] = []
    serial = 0
    for _ in range(steps):
        clock.advance(rng.random())
        op = rng.random()
        if op < 0.35:
            want = None if r.waiters else scan_least_loaded(r)
            g = r.acquire()
            assert (g.instance if g else None) is want
            if g is not None:
                leases.append(g.lease_id)
            elif rng.random() < 0.5:
                r.enqueue()
        elif op < 0.6 and leases:
            lid = leases.pop(rng.randrange(len(leases)))
            for _, g in r.release(lid)[1]:
                leases.append(g.lease_id)
        elif op < 0.7:
            serial += 1
            inst = Instance(f"i{serial}", "addr", "n0", r.concurrency)
            if rng.random() < 0.2:
                inst.in_flight = rng.randrange(3)  # e.g. recovered with work
            if rng.random() < 0.1:
                inst.draining = True
            grants = r.add_instance(inst, cold=rng.random() < 0.5)
            leases.extend(g.lease_id for _, g in grants)
        elif op < 0.75 and r.instances:
            r.drain(rng.choice(list(r.instances)))
        elif op < 0.82 and r.instances:
            r.remove_instance(rng.choice(list(r.instances)))
        elif op < 0.84 and r.instances:
            iid = rng.choice(list(r.instances))
            adopted = [f"old/{serial}/{k}" for k in range(rng.randrange(3))]
            grants = r.add_instance(r.instances[iid], leases=adopted)  # a handover's
            leases.extend(adopted + [g.lease_id for _, g in grants])
        elif op < 0.86:
            grants = r.update_spec(rng.choice([1, 2, 3, 4]), 50)
            leases.extend(g.lease_id for _, g in grants)
        elif op < 0.88:
            clock.advance(10.0)
            leases.extend(g.lease_id for _, g in r.expire_leases())
        elif op < 0.9 and leases:
            r.release(leases[-1])  # twice: the second is unknown
            r.release(leases.pop())
        elif op < 0.92 and r.waiters:
            r.cancel(r.waiters[0])
        # The index always names the scan's choice, and the totals hold.
        assert r._least_loaded() is scan_least_loaded(r)
        check_totals(r)


@pytest.mark.parametrize("seed", range(40))
def test_indexed_choice_and_totals_match_a_scan(seed):
    random_walk(seed, 1500)


def test_ties_go_to_the_oldest_and_a_readded_instance_is_newest():
    r = FunctionRouter("f", 2, 10, ManualClock())
    for i in range(3):
        r.add_instance(Instance(f"i{i}", "a", "n", 2))
    assert [r.acquire().instance.instance_id for _ in range(3)] == ["i0", "i1", "i2"]
    r.remove_instance("i0")
    r.add_instance(Instance("i0", "a", "n", 2))  # back, but now the newest
    assert r.acquire().instance.instance_id == "i0"  # least loaded (0 in flight)
    assert r.acquire().instance.instance_id == "i1"  # all at 1: oldest first


def test_stale_entries_do_not_pile_up():
    r = FunctionRouter("f", 1, 10_000, ManualClock())
    for i in range(5000):
        r.add_instance(Instance(f"i{i}", "a", "n", 1))
        if i >= 2:
            # The newest idle ones go (as the autoscaler picks them); their
            # entries sit deep in the heap and would never reach its top.
            r.remove_instance(f"i{i - 1}")
    assert len(r.instances) == 2 and len(r._free) <= 2 * 2 + 17
    assert r.acquire().instance.instance_id == "i0"


def test_instances_given_at_construction_are_indexed():
    insts = {f"i{k}": Instance(f"i{k}", "a", "n", 2, in_flight=k) for k in range(3)}
    r = FunctionRouter("f", 2, 10, ManualClock(), instances=insts)
    assert r.acquire().instance.instance_id == "i0"
    check_totals(r)
