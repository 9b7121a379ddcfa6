"""Atoll-like two-level scheduling (Singhvi et al., "Atoll: A Scalable
Low-Latency Serverless Platform", SoCC'21).

Level one: a central load balancer that every request passes, routing it
to the semi-global scheduler (SGS) serving its application. Level two:
``sgs`` schedulers, each owning a fixed worker pool (the nodes split evenly)
whose state it knows exactly, so it places without probes (least-loaded
node of its pool that fits). An application starts with one SGS; it is
scaled per application: when its SGSs' pools cannot hold a new instance, or
its home SGS is backed up beyond ``backlog_s``, the central controller adds
another SGS (and its pool) to the application after ``scale_delay_s``.
Placements rotate over the application's SGSs; a placement in a pool other
than the home one costs a cross-SGS round trip.

Scale-ups are triggered like Galaxy's (``FunctionRouter`` coalescing) and
scale-down is the production KPA with Galaxy's defaults.

Costs: an SGS pays a Schedule call's server CPU per placement and, like
Galaxy's Schedule and the Sparrow-like scheduler, the client side of the
CreateInstance call it makes (``schedule.create``), half on sending and
half on the reply, which it must handle before the instance takes
requests (it routes the application's requests itself).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any

from functions.dispatch.policy import Instance
from simulator.cluster import SimNode
from simulator.frontend import RoutedModel
from simulator.system import Env


@dataclass(frozen=True)
class AtollConfig:
    """Parameters of the Atoll-like model."""

    sgs: int = 8
    #: controller decision plus the new SGS taking the application (assumed)
    scale_delay_s: float = 1.0
    #: home SGS queueing beyond which the application gets another SGS
    backlog_s: float = 0.05


class _Ask:
    __slots__ = ("asked", "fn", "tried")

    def __init__(self, fn: int, asked: float) -> None:
        self.fn, self.asked, self.tried = fn, asked, 0


class AtollModel(RoutedModel):
    """See the module docstring."""

    name = "atoll"

    def __init__(self, env: Env, **overrides: Any) -> None:
        self.cfg = replace(AtollConfig(), **overrides)
        k = min(self.cfg.sgs, len(env.cluster.nodes))
        self.lb = env.station("atoll-lb")
        self.sgs = [env.station(f"sgs-{i}") for i in range(k)]
        #: each function's SGSs, home first
        self.sets: list[list[int]] = [[fn % k] for fn in range(len(env.workload.functions))]
        super().__init__(env, lambda fn: self.sgs[self.sets[fn][0]], via=self.lb)
        self.pools: list[list[SimNode]] = [[] for _ in range(k)]
        for node in env.cluster.nodes:
            self.pools[node.index % k].append(node)
        # Each SGS's view of its pool, least utilised first: a heap of
        # (utilisation, node seq, node index) refreshed on every change of a
        # node (stale entries are dropped when they reach the top).
        self.heaps: list[list[tuple[float, int, int]]] = [
            [(0.0, n.seq, n.index) for n in pool] for pool in self.pools
        ]
        for h in self.heaps:
            heapq.heapify(h)
        env.cluster.on_change = self._node_changed
        self._rr = [0] * len(self.fns)
        self._extending: set[int] = set()
        self.s_place = env.op("schedule.schedule")
        self.s_decide = env.op("schedule.decide")
        self.s_create = env.op("schedule.create", 0.5)
        self.rec.control_instances(0.0, "load_balancer", 1)
        self.rec.control_instances(0.0, "sgs_extra_assignments", 0)

    def start_instances(self, fn: int, n: int) -> None:
        self.front.router(fn).begin_scale_up(n)
        self.rec.asked(self.sim.now, n)
        home = self.sgs[self.sets[fn][0]]
        if home.backlog(self.sim.now) > self.cfg.backlog_s:
            self._extend(fn)
        for _ in range(n):
            self._send(_Ask(fn, self.sim.now))

    def _send(self, ask: _Ask) -> None:
        s = self.sets[ask.fn]
        i = s[self._rr[ask.fn] % len(s)]
        self._rr[ask.fn] += 1
        if i == s[0]:
            # The home SGS decides in the process that asked (it routes the
            # function's requests): a decision over its own view, charged
            # as Galaxy's credit decision is (schedule.decide, no hop).
            t, cost = self.sim.now, self.s_decide()
        else:
            # Another pool's SGS: a round trip to a remote scheduler, which
            # pays a Schedule call's server work.
            t, cost = self.sim.now + 3 * self.net.hop(), self.s_place()
        self.sim.pipeline(t, [(self.sgs[i], cost, 0.0)], self._place, (ask, i))

    def _place(self, a: tuple[_Ask, int]) -> None:
        ask, i = a
        need = self.needs[ask.fn]
        best = self._least_loaded(i)
        if best is not None and not best.cap.fits(need):
            best = None  # the least-loaded node cannot hold it: the pool is full
        if best is None:
            ask.tried += 1
            if ask.tried < len(self.sets[ask.fn]):
                self._send(ask)  # the next SGS of the application
            elif len(self.sets[ask.fn]) < len(self.sgs):
                self._extend(ask.fn)
                ask.tried = 0
                self.sim.after(self.cfg.scale_delay_s, self._send, ask)
            else:
                self.rec.gave_up(ask.asked)
                self.front.failed(ask.fn, "no_capacity")
            return
        self.rec.scheduled(ask.asked, self.sim.now)
        iid = self.new_id(ask.fn)
        self.env.cluster.allocate(best, iid, need)
        t = self.sgs[i].finish(self.sim.now, self.s_create())
        self.create_on(best, ask.fn, iid, t + self.net.hop())

    def ready(self, a: tuple[SimNode, int, str]) -> None:
        """The instance is up: the CreateInstance reply reaches the SGS
        that owns its node (the one that placed it), which then routes to it."""
        node, fn, iid = a
        self.rec.started(self.sim.now)
        inst = Instance(iid, node.address, node.id, self.fns[fn].concurrency, meta=node)
        sgs = self.sgs[node.index % len(self.sgs)]
        t = self.sim.now + self.net.hop()
        self.sim.reply(t, sgs, self.s_create(), self.routable, (fn, inst))

    def _node_changed(self, node: SimNode) -> None:
        heapq.heappush(
            self.heaps[node.index % len(self.sgs)], (node.utilization(), node.seq, node.index)
        )

    def _least_loaded(self, i: int) -> SimNode | None:
        h, nodes = self.heaps[i], self.env.cluster.nodes
        while h:
            _, seq, idx = h[0]
            if nodes[idx].seq == seq:
                return nodes[idx]
            heapq.heappop(h)  # an older view of a node that changed since
        return None

    def _extend(self, fn: int) -> None:
        """The controller gives fn one more SGS (the one with most free
        capacity), after scale_delay_s."""
        if fn in self._extending or len(self.sets[fn]) >= len(self.sgs):
            return
        self._extending.add(fn)
        self.rec.count("sgs_scale_outs")

        def done(_: object) -> None:
            self._extending.discard(fn)
            have = set(self.sets[fn])
            # The SGS whose least-loaded node is emptiest.
            free = []
            for j in range(len(self.sgs)):
                node = None if j in have else self._least_loaded(j)
                if node is not None:
                    free.append((-node.utilization(), -j, j))
            if free:
                self.sets[fn].append(max(free)[2])
                extra = sum(len(s) - 1 for s in self.sets)
                self.rec.control_instances(self.sim.now, "sgs_extra_assignments", extra)

        self.sim.after(self.cfg.scale_delay_s, done)
