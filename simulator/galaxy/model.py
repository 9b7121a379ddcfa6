"""Galaxy as a discrete-event model that drives the production policies.

Per DESIGN.md: a client (the SDK) sends each request to the Dispatch
instance that owns its function (rendezvous hashing); Dispatch routes it with
the function's ``FunctionRouter`` (``acquire``/``enqueue``/``release``) and,
when no slot is free, starts as many instances as ``scale_ups_needed`` says
(cold-start coalescing). Each start is a Schedule request to the Schedule
instance the function hashes to (spilling to the next ones on NoFit); that
instance runs its ``PlacementPolicy`` over its own node partition (probes,
probe cache, reservation, confirm/reject) and has the node create the
instance. ClusterMgr instances (``NodeRegistry``) receive node heartbeats and
forward them to the owning Schedule instance (ModNode). Membership comes
from the production ``ControlRegistry``; partitions from
``controlplane.runtime.rendezvous`` via ``MembershipView``.

Nothing here decides anything the production code decides: this module only
moves messages between those objects, with network delays (``Network``) and
service times (``Calibration``) in between.

Variants (``VARIANTS``): G1 = one instance of each control function, no
caches; Gn = n instances, no caches; Gn-C = Gn plus the connection cache;
Gn-CP = Gn-C plus the probe cache; Gn-CPE = Gn-CP plus exact partitions
(no probe unless a node's view is in doubt; frees reported at once), and
the controller scaling control functions on SRPS; galaxy = Gn-CPE plus
capacity credits (``simulator.galaxy.credits``: a scale-up that fits a
slice Schedule lent its Dispatch instance goes to the node agent directly).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from controlplane.controller.scaling import DEFAULT_MAX_INSTANCES
from controlplane.runtime import loadreport as _REPORT
from controlplane.runtime.resources import Res
from functions.clustermgr.config import ClusterMgrConfig
from functions.dispatch.config import DispatchConfig
from functions.dispatch.policy import FunctionRouter, Instance
from functions.dispatch.startneed import StartPace
from functions.dispatch.waits import wait_timeout_s
from functions.schedule.config import ScheduleConfig
from simulator.frontend import RoutedModel
from simulator.galaxy.control import ControlPlane
from simulator.galaxy.handover import Handovers
from simulator.galaxy.placement import Placer, ScaleUp
from simulator.system import Env

_SCHEDULE = ScheduleConfig()
_DISPATCH = DispatchConfig()
_CLUSTERMGR = ClusterMgrConfig()


@dataclass(frozen=True)
class GalaxyConfig:
    """Parameters of the Galaxy model (defaults: the full system)."""

    #: instances of each control function (n of G_n; the start when scaling)
    instances: int = 4
    connection_cache: bool = True
    probe_cache: bool = True
    #: PlacementPolicy: candidates per placement, probe TTL, rounds
    #: (production's defaults: ``ScheduleConfig``)
    d: int = _SCHEDULE.probe_d
    probe_ttl_s: float = _SCHEDULE.probe_ttl_s
    #: exact partitions: trust the own view, probe only nodes in doubt;
    #: node agents report a node's status right after a free
    exact: bool = _SCHEDULE.exact_partition
    max_attempts: int = _SCHEDULE.max_attempts
    #: Dispatch spills a scale-up to at most this many further Schedule
    #: instances (``DispatchConfig``)
    max_spill: int = _DISPATCH.max_spill
    #: node heartbeat period (``ClusterMgrConfig``)
    heartbeat_s: float = _CLUSTERMGR.heartbeat_ms / 1000.0
    #: "changes": a node heartbeats only when its status changed (an
    #: unchanged heartbeat changes no decision); "all": every period.
    heartbeats: str = "changes"
    #: how long a status the owner already counts (a start) may wait for
    #: company in ClusterMgr's outbox (None: two heartbeat periods, as
    #: ``ClusterMgrConfig.covered_linger_ms``)
    covered_linger_s: float | None = (
        None if _CLUSTERMGR.covered_linger_ms is None else _CLUSTERMGR.covered_linger_ms / 1000.0
    )
    #: the controller scales control functions on SRPS (needs the scaling module)
    controller_scaling: bool = True
    report_s: float = 1.0
    #: load report interval while a kind is saturated (``LoadReporter``)
    burst_report_s: float = _REPORT.BURST_INTERVAL_S
    #: instances of each kind at most: production's limit
    #: (``controller.scaling.DEFAULT_MAX_INSTANCES``); more only as production
    #: allows it, with ``--max-instances KIND=N`` (``ControllerConfig``)
    max_instances: int = DEFAULT_MAX_INSTANCES
    #: warm standby instances kept per kind (``--standby-instances``): a
    #: scale-out promotes one with no process start, and a replacement starts
    standby: int = 0
    #: capacity credits (``simulator.galaxy.credits``): Schedule lends
    #: Dispatch slices of node capacity, and a scale-up that fits one goes
    #: to the node agent directly (production defaults: ``ScheduleConfig``,
    #: ``DispatchConfig``)
    credits: bool = _SCHEDULE.credits and _DISPATCH.credits
    credit_slice: Res = _SCHEDULE.credit_slice
    credit_ttl_s: float = _SCHEDULE.credit_ttl_ms / 1000.0
    credit_grace_s: float = _SCHEDULE.credit_grace_ms / 1000.0
    credit_target: int = _DISPATCH.credit_target
    credit_floor: int = _DISPATCH.credit_floor
    credit_shrink_s: float = _DISPATCH.credit_shrink_ms / 1000.0
    credit_renew_s: float = _DISPATCH.credit_renew_ms / 1000.0
    credit_idle_s: float = _DISPATCH.credit_idle_ms / 1000.0
    credit_max_starting: int = _DISPATCH.credit_max_starting
    #: credits one Dispatch instance may hold from one Schedule instance
    #: (``ScheduleConfig.credits_per_holder``: the ledger's limit)
    credits_per_holder: int = _SCHEDULE.credits_per_holder
    #: placement scoring term (``functions.schedule.scoring`` registry).
    #: Not Schedule's default (``model_locality``): the simulated functions
    #: name no models, and for them that term is ``least_loaded`` exactly,
    #: so the reports keep naming what decides.
    scoring: str = "least_loaded"

    def params(self) -> dict[str, Any]:
        """For reports."""
        return asdict(self)

    def schedule_config(self) -> ScheduleConfig:
        """The production ``ScheduleConfig`` these parameters describe: what
        ``functions.schedule.factory`` builds each Schedule instance's
        policy and ledger from, as the servicer does."""
        return ScheduleConfig(
            probe_d=self.d,
            probe_cache=self.probe_cache,
            probe_ttl_ms=self.probe_ttl_s * 1000.0,
            exact_partition=self.exact,
            max_attempts=self.max_attempts,
            credits=self.credits,
            credit_cpu_millis=self.credit_slice.cpu_millis,
            credit_memory_mib=self.credit_slice.memory_mib,
            credit_ttl_ms=self.credit_ttl_s * 1000.0,
            credit_grace_ms=self.credit_grace_s * 1000.0,
            credits_per_holder=self.credits_per_holder,
            scoring=self.scoring,
        )


VARIANTS: dict[str, GalaxyConfig] = {
    "G1": GalaxyConfig(
        instances=1,
        connection_cache=False,
        probe_cache=False,
        controller_scaling=False,
        exact=False,
        credits=False,
    ),
    "Gn": GalaxyConfig(
        connection_cache=False,
        probe_cache=False,
        controller_scaling=False,
        exact=False,
        credits=False,
    ),
    "Gn-C": GalaxyConfig(probe_cache=False, controller_scaling=False, exact=False, credits=False),
    "Gn-CP": GalaxyConfig(controller_scaling=False, exact=False, credits=False),
    #: Gn-CP + exact partitions + the controller (the full system before credits)
    "Gn-CPE": GalaxyConfig(credits=False),
    "galaxy": GalaxyConfig(),
}


class GalaxyModel(RoutedModel):
    """See the module docstring."""

    name = "galaxy"
    #: production Dispatch's waiter bound (RESOURCE_EXHAUSTED past it)
    max_queue = DispatchConfig().max_queue
    #: production's wait for a slot: the simulated clients set no deadline,
    #: the function's request timeout is Dispatch's default lease ttl
    wait_s: float | None = wait_timeout_s(None, DispatchConfig().lease_ttl_ms / 1000.0)

    def __init__(self, env: Env, cfg: GalaxyConfig | None = None, **overrides: Any) -> None:
        self.cfg = replace(cfg or GalaxyConfig(), **overrides)
        super().__init__(env, owner=lambda fn: self.front.owner(fn))
        self.handovers = Handovers(self)
        self.control = ControlPlane(self)
        self.placer = Placer(self)
        # The client computes the owner itself (rendezvous), so no forwarding
        # hop; a function's routing state lives on its current owner.
        self.front.owner = self.control.dispatch_station
        self.front.owners = self.control.dispatch_stations
        self.front.on_unknown_release = self.release_unknown

    def start(self) -> None:
        self.control.start()
        if self.placer.credits is not None:
            self.sim.every(self.cfg.report_s, self.placer.credits.tick)
        super().start()

    def finish(self) -> None:
        self.control.finish()
        super().finish()

    def make_router(self, fn: int) -> FunctionRouter:
        """The production router, with Dispatch's start pacing (``startneed``:
        waiting requests count for the slot time they need within a start)."""
        router = super().make_router(fn)
        router.pace = StartPace()
        return router

    def start_instances(self, fn: int, n: int) -> None:
        """Dispatch starts n instances: each a Schedule request."""
        router = self.front.router(fn)
        router.begin_scale_up(n)
        df = self.control.dispatch_owner(fn)
        for _ in range(n):
            self.placer.start(df, fn, router)

    def instance_ready(self, su: ScaleUp) -> None:
        """A started instance reached its Dispatch instance."""
        node = su.node
        assert node is not None
        inst = Instance(su.iid, node.address, node.id, self.fns[su.fn].concurrency, meta=node)
        self.handovers.instance_ready(su.df, su.fn, inst, su.router)
        router = su.router
        if router is not None and router.waiters and router is self.front.routers[su.fn]:
            n = router.scale_ups_needed()  # waiters it could not take (``starts.ask_again``)
            if n:
                self.start_instances(su.fn, n)

    def scale_up_failed(self, su: ScaleUp) -> None:
        """No Schedule instance could place it."""
        self.rec.gave_up(su.asked)
        if su.router is self.front.routers[su.fn]:
            self.front.failed(su.fn, "no_capacity")
        elif su.router is not None:  # handed over: its waiters go to the owner
            self.handovers.late_failure(su.df, su.fn, su.router)

    def release_unknown(self, fn: int, lease_id: str) -> None:
        """A release reached fn's owner before the lease it releases (a
        handover under way): its core remembers it."""
        self.control.dispatch_owner(fn).ownership.release(None, lease_id)
