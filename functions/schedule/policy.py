"""Placement policy of one Schedule instance's partition. Pure: no I/O.

The policy owns the node table (statuses ClusterMgr sends with ModNode), the
probe cache (recent free-capacity answers of node agents) and the in-flight
reservations. A placement is a small state machine that the caller drives,
so the gRPC servicer and the discrete-event simulator run the same code:

    pl = policy.begin(need)
    while True:
        step = policy.advance(pl)
        if isinstance(step, NoFit):            # nothing fits: step.reason
            break
        if isinstance(step, ProbeNodes):       # ask these agents, feed answers back
            for t in step.targets:
                policy.record_probe(pl, t.node_id, probe(t))   # NodeInfo or None
            continue
        r = step                               # Reservation: create the instance
        outcome = create(r.node_id, r.address)
        if outcome == "ok":        policy.confirm(r); break
        if outcome == "exhausted": policy.reject(r); continue   # stale view: retry
        policy.abort(r); break                  # other failure

**Exact partitions** (``exact=True``, the default): this policy is the only
allocator of its partition, so what it placed is known exactly and the
only thing it cannot see is what was freed -- which node agents report at
once (a status right after a free). A node's free capacity is then its
last status's settled allocation (``allocated - starting``), less the
placements confirmed since that the status does not count yet (each
confirm carries the node's seq when the instance became ready), less the
reservations in flight. No probe is needed; a node is probed again only
when its view is in doubt: its agent refused a reservation (someone else
allocated: a partition handover, a restarted agent) or a probe failed.

Without them (the ablation's earlier steps), a node's free capacity is the
freshest of a probe answer younger than the TTL (cache on) and the last
status, less what this policy placed since; a placement reserves only on a
node whose capacity a probe reported (cached, or for this very placement).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable

from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.resources import Res
from functions.schedule.config import ScheduleConfig
from functions.schedule.holders import ModelHolders, add_holders
from functions.schedule.model import (
    ZERO,
    NodeInfo,
    NodeState,
    NoFit,
    Placement,
    Placing,
    ProbeNodes,
    Reservation,
    Score,
    Stats,
    Target,
    describe,
    least_loaded,
)

# fmt: off
__all__ = [
    "NoFit", "NodeInfo", "Placement", "PlacementPolicy", "ProbeNodes", "Res",
    "Reservation", "Stats", "Target", "describe", "least_loaded",
]
# fmt: on


#: Production's defaults (one place: ``ScheduleConfig``).
_DEFAULTS = ScheduleConfig()


class PlacementPolicy:
    """Power-of-d placement with a probe cache over one node partition.

    d: candidates compared per placement. probe_cache: trust probe answers
    younger than probe_ttl_s (otherwise every placement probes its d
    candidates). max_attempts: rounds of candidates (including retries after a
    RESOURCE_EXHAUSTED from an agent) before a placement fails.
    """

    def __init__(
        self,
        schedule_id: str = "",
        *,
        d: int = _DEFAULTS.probe_d,
        probe_cache: bool = _DEFAULTS.probe_cache,
        probe_ttl_s: float = _DEFAULTS.probe_ttl_s,
        max_attempts: int = _DEFAULTS.max_attempts,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        score: Score = least_loaded,
        exact: bool = _DEFAULTS.exact_partition,
    ) -> None:
        if d < 1:
            raise ValueError("d must be >= 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.schedule_id = schedule_id
        self.d = d
        self.probe_cache = probe_cache
        self.probe_ttl_s = probe_ttl_s
        self.max_attempts = max_attempts
        self.clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.score = score
        self.exact = exact
        self.stats = Stats()
        self._nodes: dict[str, NodeState] = {}
        self._ids: list[str] = []  # for O(1) random sampling
        self._index: dict[str, int] = {}
        # Nodes with a probe entry, about oldest answer first (answers can
        # arrive out of order): expired ones are pruned from the front, so
        # cache lookups touch the recently probed nodes, not the partition.
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._tick = 0
        self._next_reservation = 0
        self.holders = ModelHolders()  # the nodes that hold each model

    # ----- node table -------------------------------------------------------

    def upsert(self, info: NodeInfo) -> bool:
        """Add or refresh a node; a status with seq <= the known one is
        ignored. Returns True when the table changed."""
        n = self._nodes.get(info.node_id)
        if n is None:
            n = self._nodes[info.node_id] = NodeState(info=info)
            self.holders.update(info.node_id, None, info.models)
            if self.exact:
                n.settle(info)
            self._index[info.node_id] = len(self._ids)
            self._ids.append(info.node_id)
            return True
        if info.seq <= n.info.seq:
            return False
        self._apply_status(n, info, n.confirmed)
        return True

    def remove(self, node_id: str) -> bool:
        """Forget a node (gone, or no longer in this partition)."""
        gone = self._nodes.pop(node_id, None)
        if gone is None:
            return False
        self.holders.update(node_id, gone.info.models, None)
        i = self._index.pop(node_id)
        last = self._ids.pop()
        if last != node_id:
            self._ids[i] = last
            self._index[last] = i
        self._recent.pop(node_id, None)
        return True

    def retain(self, keep: Callable[[str], bool]) -> list[str]:
        """Drop every node for which keep(node_id) is false; returns them."""
        gone = [nid for nid in self._nodes if not keep(nid)]
        for nid in gone:
            self.remove(nid)
        return gone

    def nodes(self) -> list[NodeInfo]:
        """The node table (last reported statuses), in insertion order."""
        return [n.info for n in self._nodes.values()]

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def free(self, node_id: str) -> Res:
        """Free capacity this policy believes a known node has now (freshest
        knowledge, less its reservations); KeyError for an unknown node."""
        return self._free(self._nodes[node_id], self.clock.now())

    # ----- placement steps --------------------------------------------------

    def begin(self, need: Res, function: str | Placing = "") -> Placement:
        """Start placing one instance of ``function`` (its name, or a
        ``Placing`` naming its model too) that needs ``need``."""
        return Placement(need=need, started_at=self.clock.now(), function=function)

    def advance(self, pl: Placement) -> ProbeNodes | Reservation | NoFit:
        """The next step of a placement (see the module docstring)."""
        if pl.done:
            raise RuntimeError("placement already finished")
        if pl.reservation is not None:
            raise RuntimeError("confirm, reject or abort the reservation first")
        if pl.awaiting:
            raise RuntimeError(f"probe answers missing for {sorted(pl.awaiting)}")
        now = self.clock.now()
        if pl.candidates:  # a round was probed: choose among its answers
            r = self._choose(pl)
            if r is not None:
                return r
            pl.excluded.update(pl.candidates)
            pl.candidates, pl.known = [], set()
        if pl.attempts >= self.max_attempts:
            return self._fail(pl, now)
        pl.attempts += 1
        fresh, stale = add_holders(self, pl, *self._candidates(pl, now), now)
        if not fresh and not stale:
            return self._fail(pl, now)
        pl.candidates = fresh + stale
        pl.known = set(fresh)
        if not stale:
            r = self._choose(pl)
            assert r is not None, "a fresh candidate that fits must be reservable"
            if pl.probes == 0:
                self.stats.cache_hits += 1
            return r
        self._tick += 1
        for nid in stale:
            n = self._nodes[nid]
            pl.awaiting[nid] = (self._tick, now, n, n.confirmed)
        pl.probes += len(stale)
        self.stats.probes += len(stale)
        return ProbeNodes(tuple(Target(nid, self._nodes[nid].info.address) for nid in stale))

    def record_probe(self, pl: Placement, node_id: str, status: NodeInfo | None) -> None:
        """Feed the answer of a probe asked by ``advance`` (None = it failed)."""
        sent = pl.awaiting.pop(node_id, None)
        if sent is None:
            return
        tick, sent_at, node, confirmed_then = sent
        if self._nodes.get(node_id) is not node:
            return  # removed (or removed and re-added) meanwhile
        if status is None:
            self.stats.probe_failures += 1
            pl.excluded.add(node_id)
            node.uncertain = True
            if tick >= node.probe_tick:
                # Unreachable counts as full until the TTL passes, so a burst
                # does not spend a probe on it per placement.
                self._set_probe(node, ZERO, sent_at, tick)
            return
        if status.seq > node.info.seq:
            merged = NodeInfo(
                node_id,
                status.address or node.info.address,
                status.capacity,
                status.allocated,
                status.seq,
                status.instances,
                models=status.models,
            )
            self._apply_status(node, merged, confirmed_then)
        if tick >= node.probe_tick:  # an older answer must not replace a newer one
            # Placements confirmed after the probe was sent may be missing
            # from the answer: subtract them (exact, ``confirmed`` only grows).
            since = node.confirmed - confirmed_then
            free = (status.capacity - status.allocated - since).clamped()
            self._set_probe(node, free, sent_at, tick)
        node.uncertain = False  # what the agent says now is the view
        pl.known.add(node_id)

    def confirm(self, r: Reservation, node_seq: int = 0) -> None:
        """The instance was created: the reservation becomes an allocation.
        node_seq: the node's status seq when the instance became ready
        (CreateInstanceReply.node_seq; 0 = unknown: the next status to
        arrive is taken to count it)."""
        if r.state != "held":
            return
        r.state = "confirmed"
        r.placement.reservation = None
        r.placement.done = True
        self.stats.placements += 1
        n = r.node
        n.inflight = n.inflight - r.need
        n.confirmed = n.confirmed + r.need
        if self.exact:
            seq = node_seq or n.info.seq + 1
            if seq > n.info.seq:  # else a status that counts it came first
                n.unsettled.append((seq, r.need))
                n.unsettled_sum = n.unsettled_sum + r.need
        if n.probe_free is not None:  # the optimistic decrement
            n.probe_free = (n.probe_free - r.need).clamped()

    def reject(self, r: Reservation) -> None:
        """The agent answered RESOURCE_EXHAUSTED (or does not serve the node):
        the view was stale. The node counts as full until re-probed, and the
        placement may continue with other candidates via ``advance``."""
        if r.state != "held":
            return
        r.state = "rejected"
        pl = r.placement
        pl.reservation = None
        pl.excluded.add(r.node_id)
        pl.candidates, pl.known = [], set()
        self.stats.rejections += 1
        n = r.node
        n.inflight = n.inflight - r.need
        n.uncertain = True  # someone else allocated there: ask before using it
        if self._nodes.get(r.node_id) is n:
            self._tick += 1
            self._set_probe(n, ZERO, self.clock.now(), self._tick)

    def abort(self, r: Reservation) -> None:
        """The creation failed for another reason: release the hold and end
        the placement."""
        if r.state != "held":
            return
        r.state = "aborted"
        r.placement.reservation = None
        r.placement.done = True
        r.node.inflight = r.node.inflight - r.need

    def cancel(self, pl: Placement) -> None:
        """Abandon a placement at any step (releases a held reservation)."""
        if pl.reservation is not None:
            self.abort(pl.reservation)
        pl.awaiting.clear()
        pl.done = True

    # ----- internals --------------------------------------------------------

    def _apply_status(self, n: NodeState, info: NodeInfo, confirmed_then: Res) -> None:
        # confirmed_then: the ``confirmed`` total the status already includes.
        self.holders.update(info.node_id, n.info.models, info.models)
        n.info = info
        n.status_confirmed = confirmed_then
        if self.exact:
            n.settle(info)
            n.uncertain = False

    def _set_probe(self, n: NodeState, free: Res, at: float, tick: int) -> None:
        n.probe_free, n.probe_at, n.probe_tick = free, at, tick
        self._recent[n.info.node_id] = None
        self._recent.move_to_end(n.info.node_id)

    def _fresh(self, n: NodeState, now: float) -> bool:
        return n.probe_free is not None and now - n.probe_at <= self.probe_ttl_s

    def _free(self, n: NodeState, now: float) -> Res:
        if self.exact and not n.uncertain:
            return n.exact_free()
        if self.probe_cache and self._fresh(n, now):
            return n.cached_free()
        return n.status_free()

    def _candidates(self, pl: Placement, now: float) -> tuple[list[str], list[str]]:
        """Up to d candidates that fit per the freshest knowledge: cached
        ones first (no probe needed), the rest sampled from status views."""
        if self.exact:
            return self._exact_candidates(pl, now)
        need, d = pl.need, self.d
        fresh: list[str] = []
        if self.probe_cache:
            nodes, excluded = self._nodes, pl.excluded
            fits = []
            for nid in self._fresh_ids(now):
                # (_fresh_ids has checked ``_fresh``, inline here too)
                if nid not in excluded and nodes[nid].cached_fits(need):
                    fits.append(nid)
            # (sampling none draws no random number; ``d if ...`` is
            # min(d, len(fits)) at a tenth of the cost of the builtin)
            fresh = self.rng.sample(fits, d if d < len(fits) else len(fits)) if fits else []
        if len(fresh) >= d:
            return fresh, []
        return fresh, self._sample(d - len(fresh), set(fresh) | pl.excluded, need, now)

    def _exact_candidates(self, pl: Placement, now: float) -> tuple[list[str], list[str]]:
        """Up to d nodes that fit per the exact view, sampled uniformly:
        known ones, and those in doubt (to probe unless a fresh probe
        answer says they fit)."""
        need, nodes, skip = pl.need, self._nodes, pl.excluded
        picked: list[str] = []
        ids = self._ids
        if ids:
            randrange, size, d = self.rng.randrange, len(ids), self.d
            for _ in range(4 * d + 4):
                nid = ids[randrange(size)]
                if nid in skip or nid in picked:
                    continue
                if nodes[nid].exact_fits(need):
                    picked.append(nid)
                    if len(picked) == d:
                        break
            else:  # rejection sampling starved: the partition is nearly full
                rest = [i for i in ids if i not in skip and nodes[i].exact_fits(need)]
                picked = self.rng.sample(rest, min(d, len(rest)))
        fresh: list[str] = []
        stale: list[str] = []
        for nid in picked:
            n = nodes[nid]
            if not n.uncertain or (
                self.probe_cache and self._fresh(n, now) and n.cached_fits(need)
            ):
                fresh.append(nid)
            else:
                stale.append(nid)
        return fresh, stale

    def _fresh_ids(self, now: float) -> list[str]:
        """The nodes with a fresh probe answer (``_fresh``), oldest first."""
        recent, nodes, ttl = self._recent, self._nodes, self.probe_ttl_s
        while recent:  # drop expired entries from the old end
            nid = next(iter(recent))
            n = nodes[nid]
            if n.probe_free is not None and now - n.probe_at <= ttl:
                break
            del recent[nid]
        # Answers can arrive out of send order, so check each one too.
        out = []
        for nid in recent:
            n = nodes[nid]
            if n.probe_free is not None and now - n.probe_at <= ttl:
                out.append(nid)
        return out

    def _sample(self, k: int, skip: set[str], need: Res, now: float) -> list[str]:
        """k distinct node ids, uniformly, of nodes not in skip and not fresh
        (those were judged from the cache) that fit need per their status
        view: rejection sampling first (cheap in big partitions), then a
        full scan if that starves."""
        ids = self._ids
        if k <= 0 or not ids:
            return []
        nodes, cache, ttl = self._nodes, self.probe_cache, self.probe_ttl_s

        def ok(nid: str) -> bool:
            n = nodes[nid]
            if nid in skip:
                return False
            if cache and n.probe_free is not None and now - n.probe_at <= ttl:
                return False  # fresh (``_fresh``)
            return n.status_fits(need)

        picked: list[str] = []
        randrange, size = self.rng.randrange, len(ids)
        for _ in range(4 * k + 4):
            nid = ids[randrange(size)]
            # ok(nid), inline: this loop runs for most placements
            if nid in picked or nid in skip:
                continue
            n = nodes[nid]
            if cache and n.probe_free is not None and now - n.probe_at <= ttl:
                continue
            if n.status_fits(need):
                picked.append(nid)
                if len(picked) == k:
                    return picked
        rest = [nid for nid in ids if ok(nid)]
        return self.rng.sample(rest, min(k, len(rest)))

    def _choose(self, pl: Placement) -> Reservation | None:
        best: tuple[float, str] | None = None
        nodes, known, excluded, need = self._nodes, pl.known, pl.excluded, pl.need
        exact = self.exact
        for nid in pl.candidates:
            n = nodes.get(nid)
            if n is None or nid not in known or nid in excluded:
                continue
            if exact and not n.uncertain:
                free = n.exact_free()
            elif n.probe_free is None:
                continue
            else:
                free = n.cached_free()
            if not need.fits_in(free):
                continue
            s = self.score(n.info, free, need, pl.function)
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

    def _fail(self, pl: Placement, now: float) -> NoFit:
        pl.done = True
        self.stats.no_fit += 1
        who = f"schedule {self.schedule_id}" if self.schedule_id else "this schedule instance"
        head = f"no node in partition of {who} fits {describe(pl.need)}"
        if not self._nodes:
            return NoFit(f"{head}: the partition has no nodes")
        frees = [self._free(n, now) for n in self._nodes.values()]
        most = Res(
            max(f.cpu_millis for f in frees),
            max(f.memory_mib for f in frees),
            max(f.gpus for f in frees),
        )
        tail = (
            f"{len(self._nodes)} nodes, max free cpu {most.cpu_millis}m "
            f"mem {most.memory_mib}MiB gpu {most.gpus}"
        )
        if pl.excluded:
            tail += f"; {len(pl.excluded)} candidates were full or unreachable when tried"
        if not any(pl.need.fits_in(n.info.capacity) for n in self._nodes.values()):
            return NoFit(f"{head}: larger than any node's capacity ({tail})", permanent=True)
        return NoFit(f"{head}: {tail}")
