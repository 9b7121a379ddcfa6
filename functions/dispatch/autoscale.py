"""Function autoscaling on a Dispatch instance: one KPA autoscaler (with its
keep-alive policy) per function this instance routes, ticked periodically.

The decisions are the pure policies of ``functions/dispatch/autoscaling``; this
module only feeds them the router's numbers and turns their answers into
actions the servicer carries out (start n instances; retire these ones).
Retired instances leave the routing tables *before* they are deleted on their
node, so no request is sent to an instance that is going away.

``autoscale_step`` is one round for a set of functions, with no I/O and the
time given: Dispatch's ``FunctionAutoscaling.tick`` and the simulator's
``FunctionScaling.tick`` both call it, so the loop is written once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from controlplane.runtime import config
from controlplane.runtime.clock import Clock
from functions.dispatch.autoscaling.keepalive import make_keepalive
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, ScaleDecision
from functions.dispatch.autoscaling.kpaconfig import function_kpa
from functions.dispatch.autoscaling.llmsignal import ScalingSignal, kpa_config
from functions.dispatch.autoscaling.settings import AutoscaleConfig, AutoscaleSettings
from functions.dispatch.policy import FunctionRouter
from galaxy.v1 import common_pb2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Autoscaling flags of `galaxy serve dispatch` (``AutoscaleConfig``)."""
    config.add_arguments(p, AutoscaleConfig)


K = TypeVar("K", bound=Hashable)
#: (signal, router, rps) -> the function's fleet value of its metric
Fleet = Callable[[ScalingSignal, FunctionRouter, float], float]


def retirable(router: FunctionRouter) -> list[str]:
    """The router's draining instances with no request in flight (added
    draining with no room under max_scale): nothing routes to them, so they
    can be removed and stopped."""
    if router.live_count() == len(router.instances):
        return []  # none draining
    return [i for i, x in router.instances.items() if x.draining and x.in_flight <= 0]


@dataclass(slots=True)  # (slotted: one is made per function per tick)
class Decision(Generic[K]):
    """What one tick asks for one function (``scale``: the KPA's decision)."""

    function: K
    start: int = 0
    retire: list[str] = field(default_factory=list)
    scale: ScaleDecision | None = None
    #: the scaling metric observed, when not concurrency
    metric: str = ""

    @property
    def reason(self) -> str:
        """Why, for logs (made only when asked: the simulator rarely does)."""
        why = self.scale.reason if self.scale is not None else ""
        return f"{self.metric} {why}" if self.metric else why


def autoscale_step(
    now: float,
    routers: Iterable[tuple[K, FunctionRouter]],
    scaler_of: Callable[[K], KpaAutoscaler | None],
    observed_of: Callable[[K, FunctionRouter], tuple[str, float] | None] | None = None,
) -> Iterator[Decision[K]]:
    """One autoscaling round: each function's autoscaler (``scaler_of``;
    None skips the function this round) observes its router's concurrency
    (in flight plus queued, ``FunctionRouter.demand``) and last activity,
    decides against the live and starting instances, and names the idle
    instances to retire (with any idle one the router added draining,
    ``retirable``). A decision is yielded for every function ticked,
    changes or not. ``observed_of``
    gives (metric, value) for a function scaling on another metric than
    concurrency (None: concurrency)."""
    for key, router in routers:
        scaler = scaler_of(key)
        if scaler is None:
            continue
        other = observed_of(key, router) if observed_of is not None else None
        # (waiting requests as the slots they need within a start's time)
        value = float(router.demand()) if other is None else other[1]
        scaler.observe(now, value, last_active=router.last_active or None)
        d = scaler.decide(now, router.live_count(), router.pending)
        retire = scaler.instances_to_remove(d, router.instances.values()) if d.to_remove else []
        # Instances added draining (no room under max_scale), now idle.
        surplus = retirable(router)
        retire = retire + surplus if surplus else retire
        yield Decision(key, d.to_start, retire, d, other[0] if other is not None else "")


class FunctionAutoscaling:
    """KPA autoscalers for the functions one Dispatch instance routes."""

    def __init__(
        self, settings: AutoscaleSettings, clock: Clock, fleet: Fleet | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock
        #: a function's fleet value of an engine metric (``llmroute.LlmRouting.fleet``)
        self.fleet = fleet
        self._scalers: dict[str, tuple[int, KpaAutoscaler]] = {}
        #: requests served per function since its last tick (its rps), and when
        self._served: dict[str, int] = {}
        self._last_tick = clock.now()

    def served(self, function: str) -> None:
        """Count one request of function (its ``rps`` metric)."""
        self._served[function] = self._served.get(function, 0) + 1

    def _observed(
        self, spec: common_pb2.FunctionSpec, router: FunctionRouter, elapsed: float
    ) -> tuple[str, float] | None:
        a = spec.autoscaling
        if a.metric in ("", "concurrency") and not (a.ttft_ms or a.tpot_ms):
            return None  # (most functions: no signal object made per tick)
        signal = ScalingSignal.from_proto(spec.autoscaling)
        rps = self._served.get(spec.name, 0) / elapsed if elapsed > 0 else 0.0
        if signal.metric == "rps" or self.fleet is None:
            return signal.metric, rps if signal.metric == "rps" else float(router.load())
        return signal.metric, self.fleet(signal, router, rps)

    def _scaler(self, spec: common_pb2.FunctionSpec) -> KpaAutoscaler:
        got = self._scalers.get(spec.name)
        if got is not None and got[0] == spec.version:
            return got[1]
        cfg, policy, opts = function_kpa(self.settings, spec)
        signal = ScalingSignal.from_proto(spec.autoscaling)
        if signal.metric != "concurrency":  # the KPA's target is the metric's
            cfg = kpa_config(signal, cfg, spec.concurrency or 1)
        scaler = KpaAutoscaler(cfg, make_keepalive(policy, **opts))
        self._scalers[spec.name] = (spec.version, scaler)
        return scaler

    def tick(
        self,
        routers: dict[str, FunctionRouter],
        specs: dict[str, common_pb2.FunctionSpec],
    ) -> list[Decision[str]]:
        """One autoscaling round over every routed function (the decisions
        that change something)."""
        for gone in set(self._scalers) - set(routers):
            del self._scalers[gone]  # deleted or handed over
        if not self.settings.enabled:
            # No scaling, but surplus instances (see ``retirable``) still go.
            out = [Decision(n, retire=retirable(r)) for n, r in routers.items()]
            return [d for d in out if d.retire]

        def scaler_of(name: str) -> KpaAutoscaler | None:
            spec = specs.get(name)  # None: spec being refreshed; next tick
            return None if spec is None else self._scaler(spec)

        now = self.clock.now()
        elapsed, self._last_tick = now - self._last_tick, now

        def observed_of(name: str, router: FunctionRouter) -> tuple[str, float] | None:
            spec = specs.get(name)
            return None if spec is None else self._observed(spec, router, elapsed)

        step = autoscale_step(now, routers.items(), scaler_of, observed_of)
        out = [d for d in step if d.start or d.retire]
        self._served.clear()
        return out
