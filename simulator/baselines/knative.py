"""Knative-like centralized control plane.

Scaling: the production KPA (``functions.dispatch.autoscaling.kpa``) with Knative's
defaults (``KpaConfig.knative_baseline``: 2 s tick, 60 s stable / 6 s panic
window, panic at 200%, target utilization 0.7, scale-to-zero grace 30 s, max
scale-up rate 1000). With no instance, the activator buffers requests and
pokes the autoscaler, which scales from zero at once (one pod).

A pod start passes through one central reconcile chain, each step a
controller's work plus one persisted write (API server + etcd):

    Knative serving (PodAutoscaler/SKS -> Deployment)  -> write
    Deployment controller (-> ReplicaSet)                -> write
    ReplicaSet controller (-> Pod)                       -> write
    kube-scheduler: one scheduler, ~100 pods/s           -> bind write
    kubelet on the node: create the sandbox
    endpoints controller (pod ready -> endpoints)        -> write -> activator

Each controller is a single FIFO worker (a ``Station``). The serving step's
cost is fitted so the chain completes about 2.5 pod starts/s end to end, the
2-3 cold starts/s Dirigent's authors measured for Knative (Cvetkovic et al.,
SOSP'24); the scheduler's rate is kube-scheduler's ~100 pods/s. The
scheduler places on the feasible node with the most free resources
(LeastAllocated scoring) from its own, exact cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from functions.dispatch.autoscaling.kpa import KpaConfig
from functions.dispatch.policy import FunctionRouter, Instance
from simulator.autoscale import FunctionScaling
from simulator.cluster import SimNode
from simulator.engine import Callback, Stage, Station
from simulator.frontend import RoutedModel
from simulator.system import Env


@dataclass(frozen=True)
class KnativeConfig:
    """Parameters (seconds unless named otherwise)."""

    #: activator replicas routing requests (the data path)
    activators: int = 4
    #: Knative serving reconcile per pod: fitted to ~2.5 pod starts/s (Dirigent)
    serving_s: float = 0.4
    #: Deployment / ReplicaSet / endpoints controller work per object
    controller_s: float = 0.002
    #: persisted write: API server + etcd latency ...
    write_s: float = 0.002
    #: ... and etcd's throughput (DESIGN.md section 6: ~7.6k puts/s)
    etcd_puts_per_s: float = 7600.0
    #: kube-scheduler throughput (pods/s)
    scheduler_pods_per_s: float = 100.0


class _Pod:
    __slots__ = ("asked", "fn", "iid", "node")

    def __init__(self, fn: int, asked: float, iid: str) -> None:
        self.fn, self.asked, self.iid = fn, asked, iid
        self.node: SimNode | None = None


class KnativeModel(RoutedModel):
    """See the module docstring."""

    name = "knative"
    #: its stations model the chain's fitted latency, not CPU: no platform CPU
    platform_cpu = False

    def __init__(self, env: Env, **overrides: Any) -> None:
        self.cfg = c = replace(KnativeConfig(), **overrides)
        activators = [env.station(f"activator-{i}") for i in range(c.activators)]
        super().__init__(env, lambda fn: activators[fn % c.activators])
        self.serving = env.station("knative-serving")
        self.deploy = env.station("deployment-controller")
        self.rs = env.station("replicaset-controller")
        self.scheduler = env.station("kube-scheduler")
        self.endpoints = env.station("endpoints-controller")
        self.etcd = env.station("etcd")
        self._pods: dict[str, _Pod] = {}
        for kind in ("activator", "scheduler", "controller"):
            self.rec.control_instances(0.0, kind, c.activators if kind == "activator" else 1)

    def make_scaling(self) -> FunctionScaling:
        """The production KPA with Knative's defaults."""
        f = self.fns
        return FunctionScaling(
            self.sim,
            lambda fn: KpaConfig.knative_baseline(f[fn].concurrency, max_scale=f[fn].max_scale),
            lambda fn: self.front.routers[fn],
            self.start_instances,
            self.retire,
            keepalive_opts={"seconds": self.env.cfg.keep_alive_s},
        )

    def waiting(self, fn: int, router: FunctionRouter) -> None:
        self.scaling.touched(fn)
        if router.live_count() == 0 and router.pending == 0:
            self.start_instances(fn, 1)  # the activator's poke: scale from zero now

    # -- the reconcile chain ----------------------------------------------------

    def _write(self) -> Stage:
        """A persisted write: etcd's turn, then the write latency and the
        acknowledgement's hop."""
        gap = self.cfg.write_s + self.net.hop()
        return (self.etcd, 1.0 / self.cfg.etcd_puts_per_s, gap)

    def _step(self, st: Station, service: float, then: Callback, pod: _Pod) -> None:
        """One controller's work on the pod's object, then its write."""
        stages = [(st, service, self.net.hop()), self._write()]
        self.sim.pipeline(self.sim.now + self.net.hop(), stages, then, pod)

    def start_instances(self, fn: int, n: int) -> None:
        self.front.router(fn).begin_scale_up(n)
        for _ in range(n):
            self.rec.asked(self.sim.now)
            pod = _Pod(fn, self.sim.now, self.new_id(fn))
            self._step(self.serving, self.cfg.serving_s, self._deployment, pod)

    def _deployment(self, pod: _Pod) -> None:
        self._step(self.deploy, self.cfg.controller_s, self._replicaset, pod)

    def _replicaset(self, pod: _Pod) -> None:
        self._step(self.rs, self.cfg.controller_s, self._queued, pod)

    def _queued(self, pod: _Pod) -> None:
        t = self.scheduler.finish(self.sim.now + self.net.hop(), 1 / self.cfg.scheduler_pods_per_s)
        self.sim.at(t, self._schedule, pod)

    def _schedule(self, pod: _Pod) -> None:
        need = self.needs[pod.fn]
        best: SimNode | None = None
        best_free = -1.0
        for node in self.env.cluster.nodes:  # LeastAllocated over feasible nodes
            free = node.cap.free_resources()
            if need.fits_in(free):
                score = 1.0 - node.utilization()
                if score > best_free:
                    best, best_free = node, score
        if best is None:
            self.rec.count("unschedulable")
            self.rec.gave_up(pod.asked)
            self.front.failed(pod.fn, "no_capacity")
            return
        self.rec.scheduled(pod.asked, self.sim.now)
        pod.node = best
        self._pods[pod.iid] = pod
        self.env.cluster.allocate(best, pod.iid, need)  # the scheduler's assume
        # The bind is written, then the kubelet creates the sandbox.
        stages = [self._write()]
        self.sim.pipeline(self.sim.now + self.net.hop(), stages, self._bound, pod)

    def _bound(self, pod: _Pod) -> None:
        assert pod.node is not None
        self.create_on(pod.node, pod.fn, pod.iid, self.sim.now + self.net.hop())

    def ready(self, a: tuple[SimNode, int, str]) -> None:
        """Pod running: the endpoints controller writes it, then the
        activator routes to it."""
        self.rec.started(self.sim.now)
        pod = self._pods.pop(a[2])
        self._step(self.endpoints, self.cfg.controller_s, self._routable, pod)

    def _routable(self, pod: _Pod) -> None:
        node = pod.node
        assert node is not None
        inst = Instance(pod.iid, node.address, node.id, self.fns[pod.fn].concurrency, meta=node)
        self.routable((pod.fn, inst))
