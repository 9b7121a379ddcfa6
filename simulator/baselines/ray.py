"""Ray-like bottom-up scheduling (Moritz et al., OSDI'18; Ray 2.x hybrid policy).

A new replica is requested by the central Serve controller, whose control
loop runs every ``controller_loop_s`` (Ray Serve: ``CONTROL_LOOP_INTERVAL_S``
= 0.1 s) and registers each replica actor with the GCS (a central
operation). The request goes to the raylet of a random node (requests enter
through proxies on every node). The raylet schedules locally while the
node's critical resource utilisation stays at most ``spill_threshold``
(Ray's hybrid policy: 0.5) and the replica fits; otherwise it spills to a
random node among the top ``top_fraction`` (20%) by score (lowest
utilisation among feasible nodes) in its resource view -- a view refreshed
every ``view_refresh_s`` (100 ms; Ray's resource broadcast), so stale. A
spill costs one more round trip plus the target raylet's work; a spilled
request is granted where it fits, else spilled again (at most
``max_spills`` times, then it waits one refresh period and retries). A
started replica becomes routable once the controller has broadcast the new
replica set to the proxies (service discovery: one controller operation and
a hop).

Scale-ups are triggered like Galaxy's (``FunctionRouter`` coalescing) and
scale-down is the production KPA with Galaxy's defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from controlplane.runtime.resources import Res
from functions.dispatch.policy import Instance
from simulator.cluster import SimNode
from simulator.frontend import RoutedModel
from simulator.system import Env


@dataclass(frozen=True)
class RayConfig:
    """Parameters of the Ray-like model."""

    frontends: int = 4
    spill_threshold: float = 0.5
    top_fraction: float = 0.2
    view_refresh_s: float = 0.1
    max_spills: int = 4
    max_waits: int = 100
    controller_loop_s: float = 0.1
    #: central work per replica: the Serve controller's bookkeeping and the
    #: GCS actor registration (assumed; Ray publishes no per-op figure)
    controller_op_s: float = 0.001


class _Ask:
    __slots__ = ("asked", "fn", "spills", "waits")

    def __init__(self, fn: int, asked: float) -> None:
        self.fn, self.asked, self.spills, self.waits = fn, asked, 0, 0


class RayModel(RoutedModel):
    """See the module docstring."""

    name = "ray"

    def __init__(self, env: Env, **overrides: Any) -> None:
        self.cfg = c = replace(RayConfig(), **overrides)
        proxies = [env.station(f"proxy-{i}") for i in range(c.frontends)]
        super().__init__(env, lambda fn: proxies[fn % c.frontends])
        self.controller = env.station("serve-controller")
        self.pending: list[_Ask] = []
        nodes = env.cluster.nodes
        # The stale resource view: a node's free resources as of the last
        # refresh boundary (copy-on-write: saved just before its first
        # change in a refresh period; unchanged nodes read live state).
        self._view: list[Res] = [n.cap.free_resources() for n in nodes]
        self._view_epoch = [-1] * len(nodes)
        env.cluster.before_change = self._before_change
        self.s_raylet = env.op("schedule.schedule")
        self._rng = env.rng
        self.rec.control_instances(0.0, "controller", 1)

    def start(self) -> None:
        super().start()
        self.sim.every(self.cfg.controller_loop_s, self._control_loop)

    def start_instances(self, fn: int, n: int) -> None:
        self.front.router(fn).begin_scale_up(n)
        self.rec.asked(self.sim.now, n)
        self.pending.extend(_Ask(fn, self.sim.now) for _ in range(n))

    # -- the central controller loop ---------------------------------------------

    def _control_loop(self) -> None:
        asks, self.pending = self.pending, []
        nodes = self.env.cluster.nodes
        for ask in asks:
            t = self.controller.finish(self.sim.now, self.cfg.controller_op_s) + self.net.hop()
            node = nodes[self._rng.randrange(len(nodes))]
            self.sim.pipeline(t, [(node.agent, self.s_raylet(), 0.0)], self._raylet, (node, ask))

    # -- raylets -------------------------------------------------------------------

    def _epoch(self) -> int:
        return math.floor(self.sim.now / self.cfg.view_refresh_s)

    def _before_change(self, node: SimNode) -> None:
        e = self._epoch()
        if self._view_epoch[node.index] < e:
            self._view[node.index] = node.cap.free_resources()
            self._view_epoch[node.index] = e

    def _viewed_free(self, node: SimNode, epoch: int) -> Res:
        if self._view_epoch[node.index] == epoch:
            return self._view[node.index]
        return node.cap.free_resources()

    def _raylet(self, a: tuple[SimNode, _Ask]) -> None:
        node, ask = a
        need = self.needs[ask.fn]
        fits = node.cap.fits(need)
        local_ok = fits and node.utilization() <= self.cfg.spill_threshold
        if local_ok or (ask.spills > 0 and fits):
            self._place(node, ask)
            return
        target = None if ask.spills >= self.cfg.max_spills else self._spill_target(node, need)
        if target is None:
            # Nowhere to go per the view: wait for the next refresh (Ray
            # queues infeasible work), giving up after max_waits periods.
            ask.spills = 0
            ask.waits += 1
            if ask.waits > self.cfg.max_waits:
                self.rec.count("unschedulable")
                self.rec.gave_up(ask.asked)
                self.front.failed(ask.fn, "no_capacity")
            else:
                self.rec.count("spill_waits")
                self.sim.after(self.cfg.view_refresh_s, self._raylet, (node, ask))
            return
        ask.spills += 1
        self.rec.count("spills")
        t = target.agent.finish(self.sim.now + self.net.hop(), self.s_raylet())
        self.sim.at(t, self._raylet, (target, ask))

    def _spill_target(self, here: SimNode, need: Res) -> SimNode | None:
        """A random node among the top fraction by score in the stale view."""
        epoch = self._epoch()
        scored = []
        for n in self.env.cluster.nodes:
            if n is here:
                continue
            free = self._viewed_free(n, epoch)
            if need.fits_in(free):
                cap = n.cap.capacity
                util = max(
                    1 - free.cpu_millis / cap.cpu_millis if cap.cpu_millis else 0.0,
                    1 - free.memory_mib / cap.memory_mib if cap.memory_mib else 0.0,
                )
                scored.append((util, n.index, n))
        if not scored:
            return None
        scored.sort(key=lambda x: (x[0], x[1]))
        top = scored[: max(1, int(len(scored) * self.cfg.top_fraction))]
        return top[self._rng.randrange(len(top))][2]

    def _place(self, node: SimNode, ask: _Ask) -> None:
        iid = self.new_id(ask.fn)
        if not self.env.cluster.allocate(node, iid, self.needs[ask.fn]):
            raise AssertionError("a raylet placed where its exact check said it fits")
        self.rec.scheduled(ask.asked, self.sim.now)
        self.create_on(node, ask.fn, iid, self.sim.now)

    def ready(self, a: tuple[SimNode, int, str]) -> None:
        node, fn, iid = a
        self.rec.started(self.sim.now)
        # Service discovery: the controller learns of the replica and
        # broadcasts the new replica set to the proxies.
        t = self.controller.finish(self.sim.now + self.net.hop(), self.cfg.controller_op_s)
        inst = Instance(iid, node.address, node.id, self.fns[fn].concurrency, meta=node)
        self.sim.at(t + self.net.hop(), self.routable, (fn, inst))
