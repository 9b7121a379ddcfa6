"""PlacementPolicy fast paths give what the straightforward code gives.

The free estimates of ``NodeState`` are computed component by component,
``least_loaded`` is written out, and the candidate scans inline their
checks; ``PlainPolicy`` below is the straightforward version (Res
arithmetic, closures, a plain sample). Randomized runs drive both with the
same seeds and compare every step, the random streams and the tables.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest

from controlplane.nodeagent.capacity import NodeCapacity, Res
from controlplane.runtime.clock import ManualClock
from functions.schedule.model import NodeInfo, NodeState, least_loaded
from functions.schedule.policy import NoFit, Placement, PlacementPolicy, ProbeNodes, Reservation


def plain_status_free(n: NodeState) -> Res:
    since = n.confirmed - n.status_confirmed
    return (n.info.capacity - n.info.allocated - since - n.inflight).clamped()


def plain_cached_free(n: NodeState) -> Res:
    assert n.probe_free is not None
    return (n.probe_free - n.inflight).clamped()


def plain_least_loaded(node: NodeInfo, free: Res, need: Res) -> float:
    cap, left = node.capacity, free - need
    fractions = [
        left_v / cap_v
        for left_v, cap_v in (
            (left.cpu_millis, cap.cpu_millis),
            (left.memory_mib, cap.memory_mib),
            (left.gpus, cap.gpus),
        )
        if cap_v > 0
    ]
    return min(fractions, default=0.0)


def rand_res(rng: random.Random, lo: int = -3000, hi: int = 9000) -> Res:
    return Res(rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(-2, 3))


@pytest.mark.parametrize("seed", range(5))
def test_free_estimates_are_the_res_arithmetic(seed):
    rng = random.Random(seed)
    for _ in range(3000):
        info = NodeInfo("n", "a", rand_res(rng, 0), rand_res(rng, 0), 1, 0)
        n = NodeState(info, rand_res(rng), rand_res(rng), rand_res(rng), rand_res(rng))
        need = rand_res(rng, 0, 5000)
        assert n.status_free() == plain_status_free(n)
        assert n.status_fits(need) == need.fits_in(plain_status_free(n))
        assert n.cached_free() == plain_cached_free(n)
        assert n.cached_fits(need) == need.fits_in(plain_cached_free(n))
        free = n.cached_free()
        a, b = least_loaded(info, free, need), plain_least_loaded(info, free, need)
        assert a == b and str(a) == str(b)


class PlainPolicy(PlacementPolicy):
    """The candidate scans as first written (closures, Res arithmetic)."""

    def _candidates(self, pl: Placement, now: float) -> tuple[list[str], list[str]]:
        need, d = pl.need, self.d
        fresh: list[str] = []
        if self.probe_cache:
            fits = []
            for nid in self._plain_fresh_ids(now):
                n = self._nodes[nid]
                if nid not in pl.excluded and need.fits_in(plain_cached_free(n)):
                    fits.append(nid)
            fresh = self.rng.sample(fits, min(d, len(fits)))
        if len(fresh) >= d:
            return fresh, []
        skip = set(fresh) | pl.excluded

        def ok(nid: str) -> bool:
            n = self._nodes[nid]
            if nid in skip or (self.probe_cache and self._fresh(n, now)):
                return False
            return need.fits_in(plain_status_free(n))

        return fresh, self._plain_sample(ok, d - len(fresh))

    def _plain_fresh_ids(self, now: float) -> Iterable[str]:
        while self._recent:
            nid = next(iter(self._recent))
            if self._fresh(self._nodes[nid], now):
                break
            del self._recent[nid]
        return [nid for nid in self._recent if self._fresh(self._nodes[nid], now)]

    def _plain_sample(self, ok: Callable[[str], bool], k: int) -> list[str]:
        ids = self._ids
        if k <= 0 or not ids:
            return []
        picked: list[str] = []
        for _ in range(4 * k + 4):
            nid = ids[self.rng.randrange(len(ids))]
            if nid not in picked and ok(nid):
                picked.append(nid)
                if len(picked) == k:
                    return picked
        rest = [nid for nid in ids if ok(nid)]
        return self.rng.sample(rest, min(k, len(rest)))

    def _choose(self, pl: Placement) -> Reservation | None:
        best: tuple[float, str] | None = None
        for nid in pl.candidates:
            n = self._nodes.get(nid)
            if n is None or nid not in pl.known or nid in pl.excluded or n.probe_free is None:
                continue
            free = plain_cached_free(n)
            if not pl.need.fits_in(free):
                continue
            s = self.score(n.info, free, pl.need)
            if best is None or s > best[0]:
                best = (s, nid)
        if best is None:
            return None
        n = self._nodes[best[1]]
        n.inflight = n.inflight + pl.need
        self._next_reservation += 1
        r = Reservation(self._next_reservation, best[1], n.info.address, pl.need, pl, n)
        pl.reservation = r
        return r


def step_key(step: object) -> object:
    if isinstance(step, ProbeNodes):
        return ("probe", step.targets)
    if isinstance(step, Reservation):
        return ("reserve", step.id, step.node_id, step.need)
    assert isinstance(step, NoFit)
    return ("nofit", step.reason)


def drive(policy: PlacementPolicy, seed: int, nodes: int) -> list[object]:
    """Random placements against a true cluster (NodeCapacity per node),
    with heartbeats, concurrent placements, rejections and aborts; the log
    of every step and probe answer."""
    rng = random.Random(seed)
    clock = policy.clock
    assert isinstance(clock, ManualClock)
    caps = {
        f"n{i}": NodeCapacity(Res(4000, 8192, rng.choice([0, 0, 1])), f"n{i}") for i in range(nodes)
    }
    seq = dict.fromkeys(caps, 1)

    def status(nid: str) -> NodeInfo:
        c = caps[nid]
        return NodeInfo(nid, f"agent-{nid}", c.capacity, c.allocated, seq[nid], len(c))

    for nid in caps:
        policy.upsert(status(nid))
    log: list[object] = []
    live: list[tuple[str, str]] = []
    open_pl: list[Placement] = []
    serial = 0
    for _ in range(600):
        clock.advance(rng.choice([0.0, 0.001, 0.01, 0.05, 0.3]))
        roll = rng.random()
        if roll < 0.1:  # another scheduler places on a node: this view is stale
            nid, serial = f"n{rng.randrange(nodes)}", serial + 1
            if caps[nid].fits(Res(2000, 4096, 0)):
                caps[nid].allocate(f"x{serial}", Res(2000, 4096, 0))
                seq[nid] += 1
                live.append((nid, f"x{serial}"))
            continue
        if roll < 0.3 and live:  # an instance goes away, its node heartbeats
            nid, iid = live.pop(rng.randrange(len(live)))
            caps[nid].free(iid)
            seq[nid] += 1
            policy.upsert(status(nid))
            continue
        if roll < 0.45 or not open_pl:
            need = Res(rng.choice([250, 500, 1000, 3000]), rng.choice([128, 512, 2048]), 0)
            open_pl.append(policy.begin(need))
        pl = open_pl[rng.randrange(len(open_pl))]
        step = policy.advance(pl)
        log.append(step_key(step))
        if isinstance(step, NoFit):
            open_pl.remove(pl)
        elif isinstance(step, ProbeNodes):
            for t in step.targets:
                answer = None if rng.random() < 0.05 else status(t.node_id)
                log.append(("answer", t.node_id, answer))
                policy.record_probe(pl, t.node_id, answer)
        else:
            serial += 1
            iid = f"i{serial}"
            if rng.random() < 0.03:
                policy.abort(step)
                open_pl.remove(pl)
            elif caps[step.node_id].fits(step.need):
                caps[step.node_id].allocate(iid, step.need)
                seq[step.node_id] += 1
                live.append((step.node_id, iid))
                policy.confirm(step)
                open_pl.remove(pl)
                if rng.random() < 0.5:
                    policy.upsert(status(step.node_id))
            else:
                policy.reject(step)
    log.append(("stats", policy.stats))
    log.append(("frees", [(nid, policy.free(nid)) for nid in sorted(caps)]))
    return log


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("probe_cache", [True, False])
@pytest.mark.parametrize("d,nodes", [(2, 12), (2, 60), (3, 5), (1, 30)])
def test_placements_step_for_step_as_the_plain_policy(seed, probe_cache, d, nodes):
    def make(cls: type[PlacementPolicy]) -> PlacementPolicy:
        # The probing policy (the ablation's step before exact partitions).
        return cls(
            "s",
            d=d,
            probe_cache=probe_cache,
            clock=ManualClock(),
            rng=random.Random(seed),
            exact=False,
        )

    fast, plain = make(PlacementPolicy), make(PlainPolicy)
    assert drive(fast, seed, nodes) == drive(plain, seed, nodes)
    assert fast.rng.getstate() == plain.rng.getstate()
