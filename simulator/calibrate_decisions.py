"""The CPU of a placement decision, timed in-process: Schedule's policy
calls (``schedule.decide``'s fallback and its in-process reference) and a
capacity credit's ``CreditWallet.take`` (``dispatch.credit_take``).

Dispatch times a credit start's decision around ``take`` alone
(``functions.dispatch.peers``, ``galaxy_scheduling_latency_seconds``): the
model charges that span as its own op, ``dispatch.credit_take``, on Dispatch
(it had been charged Schedule's ``schedule.decide``, a placement over a
whole partition: about twice the work, on the wrong process's speed).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.calibration import Calibration, OpCost


def take_cost(target: int = 4, takes: int = 20_000) -> float:
    """CPU seconds of one ``take`` from a wallet holding ``target`` credits
    (production's default holding), each settled right after as a created
    start: timed in-process, it is pure Python."""
    from controlplane.runtime.clock import ManualClock
    from controlplane.runtime.credits import Grant
    from controlplane.runtime.resources import Res
    from functions.dispatch.credits import CreditWallet, SyncRequest

    clock = ManualClock()
    wallet = CreditWallet(target=target, clock=clock)
    # Slices far larger than the starts: no credit is spent during the timing.
    grants = [Grant(f"c{i}", f"n{i}", "a:1", Res(10**9, 10**9), 3600.0) for i in range(target)]
    wallet.end_sync(SyncRequest("s0"), grants)
    need = Res(10, 16)
    spans = []
    for i in range(takes):
        clock.advance(0.0005)
        t0 = time.perf_counter()  # as Dispatch times it: around take alone
        use = wallet.take(need, "f")
        spans.append(time.perf_counter() - t0)
        assert use is not None
        wallet.settled(use, i)
    # The median: a take the kernel preempted is the host model's to add.
    return statistics.median(spans)


def decide_cost(nodes: int, placements: int = 20_000) -> float:
    """CPU seconds of one placement's policy work (begin, advance, confirm)
    on a PlacementPolicy over ``nodes`` nodes with the probe cache warm:
    timed in-process, it is pure Python."""
    import random

    from controlplane.runtime.clock import ManualClock
    from controlplane.runtime.resources import Res
    from functions.schedule.model import NodeInfo, ProbeNodes, Reservation
    from functions.schedule.policy import PlacementPolicy

    clock = ManualClock()
    pol = PlacementPolicy("s", clock=clock, rng=random.Random(1))
    infos = {f"n{i}": NodeInfo(f"n{i}", "a:1", Res(4000, 8192), Res(), 1) for i in range(nodes)}
    for info in infos.values():
        pol.upsert(info)
    need = Res(1, 1)
    t0 = time.process_time()
    for _ in range(placements):
        clock.advance(0.0005)
        pl = pol.begin(need)
        step = pol.advance(pl)
        while isinstance(step, ProbeNodes):
            for tg in step.targets:
                pol.record_probe(pl, tg.node_id, infos[tg.node_id])
            step = pol.advance(pl)
        assert isinstance(step, Reservation), step
        pol.confirm(step)
    return (time.process_time() - t0) / placements


#: Points of a measured distribution kept in the calibration (its shape).
SHAPE_POINTS = 200


def take_from_buckets(buckets: dict[str, float]) -> tuple[float, tuple[float, ...]] | None:
    """``dispatch.credit_take``'s mean and shape from a real Dispatch's
    credit decisions (``galaxy_scheduling_latency_seconds`` as cumulative
    bucket counts, a bench plan's ``credit_decision_buckets``): evenly spaced
    quantiles, read as the fidelity check reads quantiles (linear within a
    bucket). None with too few decisions to give a tail (under 200).

    A take in a busy Dispatch is short work in a process that is already
    running; its tail (p99 6-7x its median on this machine, against 2-3x
    for the same work in a lone asyncio process) is that process's and the
    machine's, so it is measured where it happens rather than modelled."""
    from controlplane.bench.promscrape import Histogram

    h = Histogram({float(k): float(v) for k, v in buckets.items()})
    h.count = max(h.buckets.values(), default=0.0)
    if h.count < SHAPE_POINTS:
        return None
    qs = [h.quantile((i + 0.5) / SHAPE_POINTS) for i in range(SHAPE_POINTS)]
    qs = [max(q, 1e-7) for q in qs]  # (a shape's points must be > 0)
    mean = sum(qs) / len(qs)
    return mean, tuple(q / mean for q in qs)


#: The credit take measured at the maximum rate (closed loop), kept beside
#: ``dispatch.credit_take`` (measured at half of it): a take's tail moves
#: with how busy Dispatch is (p99 0.094-0.119 ms at the maximum against
#: 0.067-0.093 at half in three quiet runs, 2026-11-29 11:03, commit
#: 88c09f1), so ``galaxy simulate-fidelity`` simulates each phase with the
#: take measured at its own load. Optional: files without it use the half one.
TAKE_AT_MAX = "dispatch.credit_take.max"


def take_ops(
    how: str, half: dict[str, float], busy: dict[str, float], cv: float
) -> dict[str, OpCost]:
    """``dispatch.credit_take`` (open loop at half the maximum) and
    ``TAKE_AT_MAX`` (closed loop at the maximum) from a credits-on bench run's
    two phases' ``credit_decision_buckets``; either is left out when its
    phase had too few decisions to give a tail."""
    from simulator.calibration import OpCost

    ops = {}
    for op, buckets, why in (
        ("dispatch.credit_take", half, "credits on, open loop at half the maximum"),
        (TAKE_AT_MAX, busy, "credits on, closed loop at the maximum"),
    ):
        take = take_from_buckets(buckets)
        if take is not None:
            ops[op] = OpCost(take[0], cv, f"{how}; {why}: the real Dispatch's credit decisions",
                             take[1])  # fmt: skip
    return ops


def at_load(cal: Calibration, phase: str) -> Calibration:
    """``cal`` for a phase of the fidelity scenario: at ``max`` the take
    measured at the maximum rate when the calibration has it."""
    from simulator.calibration import Calibration

    busy = cal.ops.get(TAKE_AT_MAX)
    if phase != "max" or busy is None:
        return cal
    ops = {**cal.ops, "dispatch.credit_take": busy}
    return Calibration(ops, dict(cal.params), dict(cal.meta), dict(cal.sources))
