"""PlacementPolicy driven step by step, as the simulator will drive it
(the probing policy: exact partitions are in test_exact.py).

The "cluster" here is real node bookkeeping (``NodeCapacity`` from the node
agent): probe answers are computed from its true allocation and creations are
admitted or refused by it, so an over-commit would show up as a refusal.
"""

from __future__ import annotations

import random
import re

import pytest

from controlplane.nodeagent.capacity import NodeCapacity, Res
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.errors import ResourceExhausted
from functions.schedule.policy import (
    NodeInfo,
    NoFit,
    PlacementPolicy,
    ProbeNodes,
    Reservation,
)


class Cluster:
    """True node state: what the node agents know."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeCapacity] = {}
        self.seq: dict[str, int] = {}
        self.probes = 0

    def add(self, node_id: str, cap: Res) -> NodeInfo:
        self.nodes[node_id] = NodeCapacity(cap, node_id)
        self.seq[node_id] = 1
        return self.status(node_id)

    def status(self, node_id: str) -> NodeInfo:
        n = self.nodes[node_id]
        return NodeInfo(
            node_id, f"agent-{node_id}", n.capacity, n.allocated, self.seq[node_id], len(n)
        )

    def probe(self, node_id: str) -> NodeInfo:
        self.probes += 1
        return self.status(node_id)

    def create(self, node_id: str, instance_id: str, need: Res) -> bool:
        try:
            self.nodes[node_id].allocate(instance_id, need)
        except ResourceExhausted:
            return False
        return True


def place(policy: PlacementPolicy, cluster: Cluster, need: Res, iid: str) -> Reservation | NoFit:
    """The driver loop of the module docstring, synchronously."""
    pl = policy.begin(need)
    while True:
        step = policy.advance(pl)
        if isinstance(step, NoFit):
            return step
        if isinstance(step, ProbeNodes):
            for t in step.targets:
                policy.record_probe(pl, t.node_id, cluster.probe(t.node_id))
            continue
        if cluster.create(step.node_id, iid, need):
            policy.confirm(step)
            return step
        policy.reject(step)


def make(n: int, cap: Res, **kw) -> tuple[PlacementPolicy, Cluster, ManualClock]:
    """The probing policy (exact partitions off: tests/schedule/test_exact.py)."""
    clock = ManualClock()
    kw.setdefault("exact", False)
    policy = PlacementPolicy("s-1", clock=clock, rng=random.Random(7), **kw)
    cluster = Cluster()
    for i in range(n):
        policy.upsert(cluster.add(f"n{i}", cap))
    return policy, cluster, clock


def test_only_fitting_nodes_are_chosen() -> None:
    policy, cluster, _ = make(6, Res(1000, 1024, 0))
    policy.upsert(cluster.add("gpu", Res(1000, 1024, 1)))
    for i in range(5):
        r = place(policy, cluster, Res(100, 64, 1) if i == 0 else Res(0, 0, 0), f"i{i}")
        assert isinstance(r, Reservation)
        if i == 0:
            assert r.node_id == "gpu"
    r = place(policy, cluster, Res(100, 64, 1), "second-gpu")
    assert isinstance(r, NoFit)
    assert "gpu=1" in r.reason and "max free cpu" in r.reason


def test_power_of_d_picks_the_least_loaded_candidate() -> None:
    # d = all nodes: the least loaded one must always win.
    policy, cluster, _ = make(4, Res(1000, 1000, 0), d=4)
    for i, used in enumerate([700, 200, 500, 900]):
        cluster.create(f"n{i}", "pre", Res(used, used, 0))
    r = place(policy, cluster, Res(100, 100, 0), "x")
    assert isinstance(r, Reservation) and r.node_id == "n1"
    assert r.placement.probes == 4


def test_d_1_is_random_and_d_2_beats_it_on_balance() -> None:
    def spread(d: int) -> int:
        policy, cluster, clock = make(20, Res(100_000, 100_000, 0), d=d, probe_cache=False)
        for i in range(400):
            clock.advance(0.01)
            assert isinstance(place(policy, cluster, Res(100, 100, 0), f"i{i}"), Reservation)
        counts = [len(n) for n in cluster.nodes.values()]
        return max(counts) - min(counts)

    assert spread(2) < spread(1)


def test_probe_cache_hit_avoids_probes() -> None:
    policy, cluster, clock = make(10, Res(4000, 4096, 0))
    first = place(policy, cluster, Res(100, 64, 0), "a")
    assert isinstance(first, Reservation) and first.placement.probes == 2
    for i in range(5):
        clock.advance(0.01)
        r = place(policy, cluster, Res(100, 64, 0), f"b{i}")
        assert isinstance(r, Reservation) and r.placement.probes == 0
    assert cluster.probes == 2 == policy.stats.probes
    assert policy.stats.cache_hits == 5
    assert policy.stats.placements == 6


def test_ttl_expiry_forces_a_reprobe() -> None:
    policy, cluster, clock = make(3, Res(4000, 4096, 0), probe_ttl_s=0.2)
    assert isinstance(place(policy, cluster, Res(100, 64, 0), "a"), Reservation)
    clock.advance(0.15)
    r = place(policy, cluster, Res(100, 64, 0), "b")
    assert isinstance(r, Reservation) and r.placement.probes == 0
    clock.advance(0.1)  # the answers from t=0 are now 250 ms old
    r = place(policy, cluster, Res(100, 64, 0), "c")
    assert isinstance(r, Reservation) and r.placement.probes == 2


def test_optimistic_decrement_stops_a_burst_without_probing() -> None:
    policy, cluster, _ = make(1, Res(1000, 1000, 0))
    a = place(policy, cluster, Res(400, 100, 0), "a")
    b = place(policy, cluster, Res(400, 100, 0), "b")
    assert isinstance(a, Reservation) and isinstance(b, Reservation)
    assert policy.free("n0") == Res(200, 800, 0)
    c = place(policy, cluster, Res(400, 100, 0), "c")
    assert isinstance(c, NoFit)
    assert cluster.probes == 1 and policy.stats.rejections == 0


@pytest.mark.parametrize("cache", [True, False])
def test_interleaved_burst_never_over_commits(cache: bool) -> None:
    """200 placements over 20 nodes, up to 24 in flight, every step of every
    placement interleaved at random. A probe is answered by the agent (from
    the true allocation at that moment) and delivered at two different
    steps; a creation lands at the agent and is confirmed at two different
    steps. The policy must never ask an agent for more than it has: no
    RESOURCE_EXHAUSTED at all, and no node ever over capacity."""
    rng = random.Random(11)
    policy, cluster, clock = make(20, Res(4000, 8192, 1), probe_cache=cache, probe_ttl_s=0.05)
    # A random subset starts partly used, to be learnt through probes only.
    for i in range(0, 20, 3):
        cluster.create(f"n{i}", "pre", Res(rng.randrange(4000), rng.randrange(8192), 0))
    pending = list(range(200))
    live: list[dict] = []
    placed = failed = 0
    while pending or live:
        if pending and ((len(live) < 24 and rng.random() < 0.5) or not live):
            i = pending.pop()
            need = Res(rng.choice([100, 250, 500, 1000]), rng.choice([128, 512, 2048]), 0)
            live.append({"id": f"i{i}", "pl": policy.begin(need), "step": None})
            continue
        clock.advance(rng.random() * 0.004)
        job = rng.choice(live)
        pl, step = job["pl"], job["step"]
        if isinstance(step, ProbeNodes):
            nid = rng.choice(sorted(pl.awaiting))
            answers = job.setdefault("answers", {})
            if nid not in answers:
                answers[nid] = cluster.probe(nid)  # the agent answers now ...
            else:
                policy.record_probe(pl, nid, answers.pop(nid))  # ... delivered later
                if not pl.awaiting:
                    job["step"] = None
        elif isinstance(step, Reservation) and not job.get("created"):
            assert cluster.create(step.node_id, job["id"], step.need), "over-commit"
            job["created"] = True
        elif isinstance(step, Reservation):
            policy.confirm(step)
            live.remove(job)
            placed += 1
        else:
            job["step"] = policy.advance(pl)
            if isinstance(job["step"], NoFit):
                live.remove(job)
                failed += 1
        for nid, n in cluster.nodes.items():
            assert n.allocated.fits_in(n.capacity), nid
    assert placed + failed == 200
    assert policy.stats.rejections == 0
    assert placed == policy.stats.placements > 100


def test_probe_cache_cuts_probes_per_placement() -> None:
    def ratio(cache: bool) -> float:
        policy, cluster, clock = make(20, Res(64_000, 256_000, 0), probe_cache=cache)
        for i in range(200):
            clock.advance(0.002)  # a 400 ms burst
            assert isinstance(place(policy, cluster, Res(250, 512, 0), f"i{i}"), Reservation)
        return policy.stats.probes / policy.stats.placements

    off, on = ratio(False), ratio(True)
    assert off == 2.0  # every placement probes its d candidates
    assert on < 0.25 * off


def test_stale_seq_is_ignored() -> None:
    policy = PlacementPolicy("s-1", clock=ManualClock(), rng=random.Random(1), exact=False)
    assert policy.upsert(NodeInfo("a", "addr", Res(1000, 1000, 0), Res(100, 0, 0), seq=5))
    assert not policy.upsert(NodeInfo("a", "addr", Res(1000, 1000, 0), Res(900, 0, 0), seq=3))
    assert not policy.upsert(NodeInfo("a", "addr", Res(1000, 1000, 0), Res(900, 0, 0), seq=5))
    assert policy.nodes()[0].allocated == Res(100, 0, 0)
    assert policy.upsert(NodeInfo("a", "addr2", Res(1000, 1000, 0), Res(300, 0, 0), seq=6))
    assert policy.nodes()[0].address == "addr2"
    assert policy.free("a") == Res(700, 1000, 0)


def test_removed_nodes_are_never_chosen() -> None:
    policy, cluster, _ = make(5, Res(1000, 1000, 0))
    assert policy.remove("n0") and not policy.remove("n0")
    assert sorted(policy.retain(lambda nid: nid in ("n3", "n4"))) == ["n1", "n2"]
    assert len(policy) == 2 and "n0" not in policy
    for i in range(20):
        r = place(policy, cluster, Res(10, 10, 0), f"i{i}")
        assert isinstance(r, Reservation) and r.node_id in ("n3", "n4")


def test_node_removed_while_probed_or_reserved() -> None:
    policy, cluster, _ = make(2, Res(1000, 1000, 0))
    pl = policy.begin(Res(100, 100, 0))
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes)
    policy.remove("n0")
    for t in step.targets:
        policy.record_probe(pl, t.node_id, cluster.probe(t.node_id))
    r = policy.advance(pl)
    assert isinstance(r, Reservation) and r.node_id == "n1"
    policy.remove("n1")
    policy.confirm(r)  # harmless on a node that is gone
    assert isinstance(place(policy, cluster, Res(1, 1, 0), "x"), NoFit)


def test_nothing_fits_gives_a_reason() -> None:
    policy, cluster, _ = make(4, Res(1000, 4096, 0))
    for i in range(4):
        cluster.create(f"n{i}", "pre", Res(800, 0, 0))
    r = place(policy, cluster, Res(500, 256, 0), "x")
    assert isinstance(r, NoFit)
    # The status views said 1000m free; the probes learnt 200m.
    assert r.reason.startswith(
        "no node in partition of schedule s-1 fits cpu=500m mem=256MiB gpu=0: "
        "4 nodes, max free cpu 200m"
    )
    empty = PlacementPolicy("s-2", clock=ManualClock())
    step = empty.advance(empty.begin(Res(1, 1, 0)))
    assert isinstance(step, NoFit) and "has no nodes" in step.reason
    assert policy.stats.no_fit == 1


def test_rejection_marks_node_full_and_retries_elsewhere() -> None:
    policy, cluster, clock = make(2, Res(1000, 1000, 0), d=1)
    pl = policy.begin(Res(600, 100, 0))
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes)
    first = step.targets[0].node_id
    policy.record_probe(pl, first, cluster.probe(first))
    r = policy.advance(pl)
    assert isinstance(r, Reservation) and r.node_id == first
    cluster.create(first, "someone-else", Res(600, 0, 0))  # the view went stale
    assert not cluster.create(first, "x", r.need)
    policy.reject(r)
    assert policy.free(first) == Res()
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes) and step.targets[0].node_id != first
    other = step.targets[0].node_id
    policy.record_probe(pl, other, cluster.probe(other))
    r2 = policy.advance(pl)
    assert isinstance(r2, Reservation) and r2.node_id == other
    policy.confirm(r2)
    assert policy.stats.rejections == 1 and policy.stats.placements == 1
    clock.advance(1.0)  # after the TTL the full mark is forgotten
    assert policy.free(first) == Res(1000, 1000, 0)


def test_retries_are_bounded() -> None:
    # Every agent refuses: the placement ends after max_attempts rounds.
    policy, cluster, _ = make(10, Res(1000, 1000, 0), max_attempts=3)
    pl = policy.begin(Res(100, 100, 0))
    rounds = 0
    while True:
        step = policy.advance(pl)
        if isinstance(step, NoFit):
            break
        if isinstance(step, ProbeNodes):
            for t in step.targets:
                policy.record_probe(pl, t.node_id, cluster.probe(t.node_id))
            continue
        rounds += 1
        policy.reject(step)
    assert rounds == 3 and policy.stats.rejections == 3
    assert re.search(r"3 candidates were full or unreachable", step.reason)


def test_failed_probe_excludes_the_candidate() -> None:
    policy, cluster, _ = make(2, Res(1000, 1000, 0))
    pl = policy.begin(Res(100, 100, 0))
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes) and len(step.targets) == 2
    policy.record_probe(pl, "n0", None)
    policy.record_probe(pl, "n1", cluster.probe("n1"))
    r = policy.advance(pl)
    assert isinstance(r, Reservation) and r.node_id == "n1"
    policy.confirm(r)
    assert policy.stats.probe_failures == 1
    # Within the TTL the unreachable node is not probed again.
    r = place(policy, cluster, Res(100, 100, 0), "y")
    assert isinstance(r, Reservation) and r.node_id == "n1" and r.placement.probes == 0


def test_abort_and_cancel_release_the_hold() -> None:
    policy, cluster, _ = make(1, Res(1000, 1000, 0))
    pl = policy.begin(Res(1000, 1000, 0))
    step = policy.advance(pl)
    assert isinstance(step, ProbeNodes)
    policy.record_probe(pl, "n0", cluster.probe("n0"))
    r = policy.advance(pl)
    assert isinstance(r, Reservation)
    assert policy.free("n0") == Res()
    policy.abort(r)
    assert policy.free("n0") == Res(1000, 1000, 0)
    pl2 = policy.begin(Res(1000, 1000, 0))
    r2 = policy.advance(pl2)
    assert isinstance(r2, Reservation) and r2.placement.probes == 0
    policy.cancel(pl2)
    assert r2.state == "aborted" and policy.free("n0") == Res(1000, 1000, 0)


def test_late_probe_answer_does_not_hide_a_confirmed_placement() -> None:
    # The agent answers a probe before a placement lands there; the answer
    # is delivered after that placement was confirmed. It must not give the
    # placed capacity back.
    policy, cluster, clock = make(1, Res(1000, 1000, 0), probe_ttl_s=0.2)
    fast = policy.begin(Res(600, 10, 0))
    assert isinstance(policy.advance(fast), ProbeNodes)
    policy.record_probe(fast, "n0", cluster.probe("n0"))
    r = policy.advance(fast)
    assert isinstance(r, Reservation)
    clock.advance(0.3)  # the cached answer expires: the next placement probes
    slow = policy.begin(Res(100, 10, 0))
    assert isinstance(policy.advance(slow), ProbeNodes)
    answered = cluster.probe("n0")  # before fast's instance lands
    assert cluster.create("n0", "fast", r.need)
    policy.confirm(r)
    policy.record_probe(slow, "n0", answered)
    assert policy.free("n0") == Res(400, 990, 0)
