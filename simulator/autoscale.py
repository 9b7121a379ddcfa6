"""Function autoscaling and keep-alive, driven through the production KPA.

Every ``tick_s`` the production round, ``functions.dispatch.autoscale.
autoscale_step``, runs over the active functions: each one's
``KpaAutoscaler`` observes its ``FunctionRouter`` and decides; starts go
through the model's scale-up path, removals take the instances it names.
This module only keeps the autoscalers, the set of active functions and the
counts for the report. The keep-alive policy is the production
one (``functions.dispatch.autoscaling.keepalive.make_keepalive``). A function with
no instance, nothing pending or queued and a decision of zero stops being
ticked until its next request, so an 8-hour trace of 500 mostly idle
functions does not pay 500 autoscalers every tick.

The same adapter serves the Knative-like baseline (with
``KpaConfig.knative_baseline``) through ``FunctionScaling``'s hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from functions.dispatch.autoscale import autoscale_step
from functions.dispatch.autoscaling.keepalive import make_keepalive
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.policy import FunctionRouter, Instance
from simulator.engine import Sim

#: (function index) -> its router, or None when it has none yet
RouterOf = Callable[[int], FunctionRouter | None]
#: (function index, instances to start) / (function index, instance id)
StartFn = Callable[[int, int], None]
RetireFn = Callable[[int, str], None]


class FunctionScaling:
    """Ticks a KPA per active function and applies its decisions."""

    def __init__(
        self,
        sim: Sim,
        make_config: Callable[[int], KpaConfig],
        router_of: RouterOf,
        start: StartFn,
        retire: RetireFn,
        keepalive: str = "fixed",
        keepalive_opts: dict[str, Any] | None = None,
        tick_s: float = 2.0,
    ) -> None:
        self.sim = sim
        self.make_config = make_config
        self.router_of = router_of
        self._start = start
        self._retire = retire
        self.keepalive = keepalive
        self.keepalive_opts = dict(keepalive_opts or {})
        self.tick_s = tick_s
        self.kpas: dict[int, KpaAutoscaler] = {}
        #: functions ticked, in activation order (a dict for deterministic order)
        self.active: dict[int, None] = {}
        self.decisions = 0
        #: the routers by function, when the caller has such a list: read
        #: directly instead of through ``router_of`` (every tick, every function)
        self.routers: list[FunctionRouter | None] | None = None
        self.panics = 0

    def start(self) -> None:
        """Begin ticking."""
        self.sim.every(self.tick_s, self.tick)

    def touched(self, fn: int) -> None:
        """fn has traffic or instances: tick it."""
        self.active[fn] = None

    def added(self, fn: int, inst: Instance) -> None:
        """An instance of fn became ready."""
        self.active[fn] = None

    def forget(self, fn: int) -> None:
        """fn's router is gone (handed over): its next one starts a new
        autoscaler, as a new owner's Dispatch does."""
        self.kpas.pop(fn, None)

    def _kpa(self, fn: int) -> KpaAutoscaler:
        kpa = self.kpas.get(fn)
        if kpa is None:
            kpa = self.kpas[fn] = KpaAutoscaler(
                self.make_config(fn), make_keepalive(self.keepalive, **self.keepalive_opts)
            )
        return kpa

    def _routed(self) -> Iterator[tuple[int, FunctionRouter]]:
        router_of, routers = self.router_of, self.routers
        for fn in list(self.active):
            r = routers[fn] if routers is not None else router_of(fn)
            if r is None:
                del self.active[fn]
                continue
            yield fn, r

    def tick(self) -> None:
        """One autoscaler round over the active functions."""
        routers = self.routers
        for d in autoscale_step(self.sim.now, self._routed(), self._kpa):
            fn, sd = d.function, d.scale
            assert sd is not None
            self.decisions += 1
            if sd.panic:
                self.panics += 1
            if d.start:
                self._start(fn, d.start)
            for iid in d.retire:
                self._retire(fn, iid)
            r = routers[fn] if routers is not None else self.router_of(fn)
            if sd.desired == 0 and r is not None and not (r.instances or r.pending or r.waiters):
                del self.active[fn]

    def describe(self) -> dict[str, Any]:
        """For reports."""
        return {
            "policy": "functions.dispatch.autoscaling.kpa.KpaAutoscaler",
            "keepalive": self.keepalive,
            "keepalive_opts": self.keepalive_opts,
            "tick_s": self.tick_s,
        }


def galaxy_kpa(
    model: Any, routers: list[FunctionRouter | None], start: StartFn, retire: RetireFn
) -> FunctionScaling:
    """The KPA with Galaxy's defaults (target = the function's concurrency,
    utilization 1.0) and the run's fixed keep-alive: Galaxy's function
    autoscaling, also given to the baselines that have none of their own."""
    f = model.fns
    fs = FunctionScaling(
        model.sim,
        lambda fn: KpaConfig(target_concurrency=f[fn].concurrency, max_scale=f[fn].max_scale),
        lambda fn: routers[fn],
        start,
        retire,
        keepalive_opts={"seconds": model.env.cfg.keep_alive_s},
    )
    fs.routers = routers
    return fs
