"""Exact partitions (PlacementPolicy(exact=True), the default): a Schedule
instance is its partition's only allocator, so it places without probing;
statuses bring frees; the view counts each placement exactly once, whether
it is starting, confirmed, or counted by a status; a node whose agent
refuses a reservation is probed before it is used again."""

from __future__ import annotations

import random

from controlplane.nodeagent.capacity import Res
from controlplane.runtime.clock import ManualClock
from functions.schedule.policy import NodeInfo, NoFit, PlacementPolicy, ProbeNodes, Reservation
from tests.schedule.test_policy import Cluster, place

CAP = Res(1000, 1000, 0)
NONE = Res()


def exact(n: int, d: int = 2) -> tuple[PlacementPolicy, Cluster]:
    policy = PlacementPolicy("s-1", d=d, clock=ManualClock(), rng=random.Random(5))
    assert policy.exact  # the default
    cluster = Cluster()
    for i in range(n):
        policy.upsert(cluster.add(f"n{i}", CAP))
    return policy, cluster


def status(node: str, allocated: Res, seq: int, starting: Res = NONE) -> NodeInfo:
    return NodeInfo(node, f"agent-{node}", CAP, allocated, seq, 0, starting)


def reserve(policy: PlacementPolicy, need: Res) -> Reservation:
    step = policy.advance(policy.begin(need))
    assert isinstance(step, Reservation), step
    return step


def test_places_without_probing_and_never_over_commits() -> None:
    policy, cluster = exact(6)
    placed = 0
    while True:
        r = place(policy, cluster, Res(300, 100, 0), f"i{placed}")
        if isinstance(r, NoFit):
            break
        placed += 1
    # 3 of 300m fit in each 1000m node: every one used, none refused.
    assert placed == 18 and cluster.probes == 0
    assert policy.stats.probes == 0 and policy.stats.rejections == 0
    assert policy.stats.cache_hits == 18
    assert r.reason.startswith("no node in partition of schedule s-1 fits cpu=300m")


def test_a_starting_instance_is_counted_once() -> None:
    policy, _ = exact(1)
    r = reserve(policy, Res(600, 100, 0))  # in flight: the agent is starting it
    assert policy.free("n0") == Res(400, 900, 0)
    # A status sent while it starts counts it in allocated and in starting.
    policy.upsert(status("n0", Res(600, 100, 0), seq=5, starting=Res(600, 100, 0)))
    assert policy.free("n0") == Res(400, 900, 0)
    policy.confirm(r, node_seq=7)  # ready at the node's seq 7
    assert policy.free("n0") == Res(400, 900, 0)
    # A status from before it was ready (seq 6, late) counts it as starting...
    policy.upsert(status("n0", Res(600, 100, 0), seq=6, starting=Res(600, 100, 0)))
    assert policy.free("n0") == Res(400, 900, 0)
    # ... one from after counts it as allocated, and the policy stops
    # counting it itself.
    policy.upsert(status("n0", Res(600, 100, 0), seq=8))
    assert policy.free("n0") == Res(400, 900, 0)
    assert policy._nodes["n0"].unsettled == []
    # Frees arrive with statuses.
    policy.upsert(status("n0", Res(0, 0, 0), seq=9))
    assert policy.free("n0") == CAP


def test_a_status_that_overtakes_the_confirm() -> None:
    policy, _ = exact(1)
    r = reserve(policy, Res(500, 100, 0))
    # The status sent after it became ready arrives before the answer.
    policy.upsert(status("n0", Res(500, 100, 0), seq=9))
    policy.confirm(r, node_seq=8)
    assert policy.free("n0") == Res(500, 900, 0)  # not subtracted twice
    policy.upsert(status("n0", Res(500, 100, 0), seq=10))
    assert policy.free("n0") == Res(500, 900, 0)


def test_a_refusal_puts_the_node_in_doubt_until_probed() -> None:
    policy, cluster = exact(1, d=1)
    cluster.create("n0", "intruder", Res(900, 0, 0))  # another allocator
    cluster.seq["n0"] += 1  # (an agent bumps its seq on every change)
    r = reserve(policy, Res(500, 100, 0))
    assert not cluster.create("n0", "x", r.need)
    policy.reject(r)
    # The next placement asks the agent first, and believes its answer.
    pl = policy.begin(Res(50, 10, 0))
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes) and [t.node_id for t in step.targets] == ["n0"]
    policy.record_probe(pl, "n0", cluster.probe("n0"))
    r2 = policy.advance(pl)
    assert isinstance(r2, Reservation) and cluster.create("n0", "y", r2.need)
    policy.confirm(r2)
    assert policy.free("n0") == Res(50, 990, 0)
    # In doubt no more: the next placement needs no probe.
    assert isinstance(policy.advance(policy.begin(Res(10, 10, 0))), Reservation)


def test_interleaved_burst_with_frees_never_over_commits() -> None:
    """Placements, their confirms and statuses interleave at random (as on
    a busy partition); the agents never refuse one."""
    rng = random.Random(11)
    policy, cluster = exact(8, d=2)
    live: list[tuple[str, str]] = []
    pending: list[tuple[Reservation, str]] = []
    seq = {n: 1 for n in cluster.nodes}
    for step in range(2000):
        roll = rng.random()
        if roll < 0.45:
            pl = policy.begin(Res(rng.choice([100, 250, 400]), 50, 0))
            r = policy.advance(pl)
            if isinstance(r, Reservation):
                iid = f"i{step}"
                assert cluster.create(r.node_id, iid, r.need), "over-committed"
                pending.append((r, iid))
        elif roll < 0.7 and pending:
            r, iid = pending.pop(rng.randrange(len(pending)))
            seq[r.node_id] += 1
            policy.confirm(r, node_seq=seq[r.node_id])
            live.append((r.node_id, iid))
        elif roll < 0.85 and live:
            node, iid = live.pop(rng.randrange(len(live)))
            cluster.nodes[node].free(iid)
        else:
            node = rng.choice(list(cluster.nodes))
            seq[node] += 1
            starting = Res()
            for r, _ in pending:
                if r.node_id == node:
                    starting = starting + r.need
            n = cluster.nodes[node]
            policy.upsert(status(node, n.allocated, seq[node], starting))
    assert policy.stats.rejections == 0 and policy.stats.probes == 0
    assert policy.stats.placements > 300
