"""Sparrow-like fully distributed scheduling (Ousterhout et al., SOSP'13).

Stateless schedulers: a frontend hands each job (the m instance starts one
function needs now) to a random scheduler. Batch sampling: the scheduler
sends d x m reservations (d = 2) to distinct random nodes, which queue them.
Late binding: when a reservation reaches the head of a node's queue and the
node can hold the function, the node asks the scheduler for a task
(getTask, one more round trip); the scheduler hands out the job's remaining
tasks first come first served and answers later askers with a no-op. A
node whose head reservation does not fit waits until capacity frees (a
scheduler never learns why its job is slow). No proactive cancellation of
leftover reservations (the paper describes it as optional).

Scale-ups are triggered like Galaxy's (the production ``FunctionRouter``
coalescing rule) and scale-down is the production KPA with Galaxy's
defaults, so only placement differs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from simulator.cluster import SimNode
from simulator.engine import Station
from simulator.frontend import RoutedModel
from simulator.system import Env


@dataclass(frozen=True)
class SparrowConfig:
    """Parameters of the Sparrow-like model."""

    schedulers: int = 4
    frontends: int = 4
    #: probes (reservations) per task: Sparrow's d = 2
    d: int = 2


class _Job:
    __slots__ = ("asked", "fn", "left", "sched")

    def __init__(self, fn: int, m: int, asked: float, sched: Station) -> None:
        self.fn, self.left, self.asked, self.sched = fn, m, asked, sched


class SparrowModel(RoutedModel):
    """See the module docstring."""

    name = "sparrow"

    def __init__(self, env: Env, **overrides: Any) -> None:
        self.cfg = c = replace(SparrowConfig(), **overrides)
        fronts = [env.station(f"frontend-{i}") for i in range(c.frontends)]
        super().__init__(env, lambda fn: fronts[fn % c.frontends])
        self.scheds = [env.station(f"sparrow-{i}") for i in range(c.schedulers)]
        nodes = env.cluster.nodes
        self.queues: list[deque[_Job]] = [deque() for _ in nodes]
        #: a node is waiting for a getTask answer
        self.asking = [False] * len(nodes)
        env.cluster.on_change = self._capacity_changed
        self.s_submit = env.op("schedule.schedule")
        self.s_probe = env.op("schedule.probe")
        self.s_task = env.op("schedule.create")
        self.a_probe = env.op("agent.probe")
        self._rng = env.rng
        self.rec.control_instances(0.0, "scheduler", c.schedulers)

    # -- scheduler: batch sampling --------------------------------------------

    def start_instances(self, fn: int, m: int) -> None:
        self.front.router(fn).begin_scale_up(m)
        self.rec.asked(self.sim.now, m)
        sched = self._rng.choice(self.scheds)  # stateless: any will do
        job = _Job(fn, m, self.sim.now, sched)
        t = sched.finish(self.sim.now + self.net.hop(), self.s_submit())
        self.sim.at(t, self._sample, job)

    def _sample(self, job: _Job) -> None:
        nodes = self.env.cluster.nodes
        k = min(len(nodes), self.cfg.d * job.left)
        self.rec.count("probes", k)
        for node in self._rng.sample(nodes, k):
            t = job.sched.finish(self.sim.now, self.s_probe()) + self.net.hop()
            self.sim.pipeline(t, [(node.agent, self.a_probe(), 0.0)], self._reserve, (node, job))

    # -- node: late binding -----------------------------------------------------

    def _reserve(self, a: tuple[SimNode, _Job]) -> None:
        node, job = a
        self.queues[node.index].append(job)
        self._next(node)

    def _capacity_changed(self, node: SimNode) -> None:
        if self.queues[node.index]:
            self._next(node)

    def _next(self, node: SimNode) -> None:
        """Serve the head reservation if the node can hold its function."""
        q = self.queues[node.index]
        if self.asking[node.index] or not q:
            return
        job = q[0]
        if not node.cap.fits(self.needs[job.fn]):
            self.rec.count("reservations_blocked")
            return  # wait for capacity (another instance retired)
        self.asking[node.index] = True
        t = job.sched.finish(self.sim.now + self.net.hop(), self.s_task())
        self.sim.at(t, self._get_task, (node, job))

    def _get_task(self, a: tuple[SimNode, _Job]) -> None:
        node, job = a
        if job.left > 0:
            job.left -= 1
            self.rec.scheduled(job.asked, self.sim.now)
            self.sim.at(self.sim.now + self.net.hop(), self._launch, (node, job))
        else:
            self.rec.count("noop_replies")
            self.sim.at(self.sim.now + self.net.hop(), self._noop, node)

    def _noop(self, node: SimNode) -> None:
        self.queues[node.index].popleft()
        self.asking[node.index] = False
        self._next(node)

    def _launch(self, a: tuple[SimNode, _Job]) -> None:
        node, job = a
        self.queues[node.index].popleft()
        self.asking[node.index] = False
        iid = self.new_id(job.fn)
        if not self.env.cluster.allocate(node, iid, self.needs[job.fn]):
            # Cannot happen: only this node's own late binding allocates on it
            # and it checked; kept as a guard that counts.
            self.rec.count("rejections")
            self.front.failed(job.fn, "no_capacity")
        else:
            self.create_on(node, job.fn, iid, self.sim.now)
        self._next(node)
