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

An idle function held by the KPA's zero gate (one instance kept through
the scale-to-zero grace or the keep-alive) is not decided every round
either, exactly: its KPA says until when the hold stands
(``KpaAutoscaler.hold_until``) while nothing changes -- no traffic, the
same last activity, ready and pending counts -- and until then a round
only keeps its sample; the samples are handed to the KPA (``observe``, at
their own times, as the round would have) before it next decides.

The same adapter serves the Knative-like baseline (with
``KpaConfig.knative_baseline``) through ``FunctionScaling``'s hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from functions.dispatch.autoscale import autoscale_step
from functions.dispatch.autoscaling.keepalive import make_keepalive
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.kpaconfig import function_kpa
from functions.dispatch.policy import FunctionRouter, Instance
from galaxy.v1 import common_pb2
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
        #: skip the rounds of held idle functions (see the module docstring);
        #: off, every round is decided (the plain code, for comparison)
        self.skip_holds = True
        #: per held function: (until, ready, pending, last activity)
        self._holds: dict[int, tuple[float, int, int, float]] = {}
        #: per held function, the times of the rounds skipped so far
        self._skipped: dict[int, list[float]] = {}
        self.skipped = 0

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
        self._holds.pop(fn, None)
        self._skipped.pop(fn, None)

    def flush(self) -> None:
        """Hand every skipped round's sample to its KPA (afterwards the
        autoscalers hold what deciding every round would have left)."""
        for fn in list(self._skipped):
            self._catch_up(fn)

    def _catch_up(self, fn: int) -> None:
        """The skipped rounds' observes, at their times, as ``autoscale_step``
        makes them (concurrency 0, the same last activity)."""
        times = self._skipped.pop(fn)
        kpa, last = self.kpas[fn], self._holds[fn][3]
        for t in times:
            kpa.observe(t, 0.0, last_active=last or None)

    def _kpa(self, fn: int) -> KpaAutoscaler:
        kpa = self.kpas.get(fn)
        if kpa is None:
            kpa = self.kpas[fn] = KpaAutoscaler(
                self.make_config(fn), make_keepalive(self.keepalive, **self.keepalive_opts)
            )
        return kpa

    def _routed(self, now: float) -> Iterator[tuple[int, FunctionRouter]]:
        router_of, routers, holds = self.router_of, self.routers, self._holds
        for fn in list(self.active):
            r = routers[fn] if routers is not None else router_of(fn)
            if r is None:
                del self.active[fn]
                if fn in holds:
                    if fn in self._skipped:
                        self._catch_up(fn)
                    del holds[fn]
                continue
            h = holds.get(fn)
            if h is not None:
                if (
                    now < h[0]
                    and not r.load()
                    and r.live_count() == h[1]
                    and r.pending == h[2]
                    and r.last_active == h[3]
                ):
                    # Held, nothing changed: the same decision (no start, no
                    # removal, no panic); only the sample is kept.
                    self.decisions += 1
                    self.skipped += 1
                    q = self._skipped.get(fn)
                    if q is None:
                        self._skipped[fn] = [now]
                    else:
                        q.append(now)
                    continue
                if fn in self._skipped:
                    self._catch_up(fn)
                del holds[fn]
            yield fn, r

    def tick(self) -> None:
        """One autoscaler round over the active functions."""
        routers, now = self.routers, self.sim.now
        for d in autoscale_step(now, self._routed(now), self._kpa):
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
            if self.skip_holds and r is not None and sd.desired and not (d.start or d.retire):
                self._hold(fn, r, sd.panic, now)
            if sd.desired == 0 and r is not None and not (r.instances or r.pending or r.waiters):
                del self.active[fn]

    def _hold(self, fn: int, r: FunctionRouter, panic: bool, now: float) -> None:
        """After a round that changed nothing: hold fn while its KPA says
        the decision stands (idle only: the rounds of a busy function read
        its traffic)."""
        if panic or r.load():
            return
        ready, pending = r.live_count(), r.pending
        until = self.kpas[fn].hold_until(now, ready, pending)
        if until > now:
            self._holds[fn] = (until, ready, pending, r.last_active)

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
    """Galaxy's function autoscaling (also given to the baselines that have
    none of their own): each function's KPA merged from the run's
    Dispatch-wide settings (``SimConfig.autoscale``, keep-alive
    ``SimConfig.keep_alive_s``) and its spec as Dispatch merges them
    (``function_kpa``)."""
    f = model.fns
    cfg = model.env.cfg
    settings = replace(cfg.autoscale, keepalive_s=cfg.keep_alive_s)

    def merged(fn: int) -> tuple[KpaConfig, str, dict[str, Any]]:
        spec = common_pb2.FunctionSpec(
            name=f[fn].name, concurrency=f[fn].concurrency, max_scale=f[fn].max_scale
        )
        return function_kpa(settings, spec)

    # Simulated specs carry no autoscaling fields: one keep-alive for all.
    _, keepalive, keepalive_opts = merged(0) if f else (None, settings.keepalive, {})
    fs = FunctionScaling(
        model.sim,
        lambda fn: merged(fn)[0],
        lambda fn: routers[fn],
        start,
        retire,
        keepalive=keepalive,
        keepalive_opts=keepalive_opts,
        tick_s=settings.tick_s,
    )
    fs.routers = routers
    return fs
