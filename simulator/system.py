"""What every system model gets (``Env``) and must provide (``SystemModel``).
The data path they share -- requests routed by the production
``FunctionRouter`` (least-loaded instance with a free slot, FIFO waiters),
so that systems differ only in their control planes -- is
``simulator.frontend``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.runtime.compiled import mypyc_attr
from controlplane.runtime.resources import Res
from functions.dispatch.autoscaling.settings import DEFAULTS as AUTOSCALE_DEFAULTS
from functions.dispatch.autoscaling.settings import AutoscaleSettings
from functions.dispatch.policy import FunctionRouter
from simulator.calibration import Calibration
from simulator.cliconfig import DEFAULT_NODES
from simulator.cluster import DEFAULT_NODE, Cluster, SimNode
from simulator.engine import Sim, Station
from simulator.host import Host
from simulator.loop import REPLY_STEPS, REQUEST_STEPS, EventLoop
from simulator.metrics import Recorder
from simulator.models import ModelSim, sizes_for
from simulator.network import Network, NetworkConfig
from simulator.workload import FunctionDef, Workload


@dataclass
class SimConfig:
    """Settings shared by all systems of one run."""

    nodes: int = DEFAULT_NODES
    node_res: Res = DEFAULT_NODE
    network: NetworkConfig = field(default_factory=NetworkConfig)
    seed: int = 1
    nodes_per_agent: int = 1
    create_parallelism: int = 8
    #: 0: every process has its own core(s); n: all share n cores (one machine).
    host_cores: int = 0
    #: the kernel's time slice on that host (0: no preemption modelled)
    host_slice_s: float = 0.0
    #: cores other work takes on that host (measured during the real run)
    host_background: float = 0.0
    #: delay to wake a core that has been idle (halted) for a while
    host_wakeup_s: float = 0.0
    #: threads a message to a sleeping process wakes in turn on that host
    host_handoffs: int = 1
    #: extra CPU of a message to a process that has been idle
    host_wake_cpu_s: float = 0.0
    #: model each process on the host as an asyncio event loop
    #: (``simulator.loop``) rather than a FIFO queue
    host_event_loops: bool = False
    #: iterations of a new call / of a reply in those loops
    host_loop_steps: tuple[int, int] = (REQUEST_STEPS, REPLY_STEPS)
    #: an idle function instance is removed after this long (keep-alive;
    #: 0: the KPA's window and grace decide): Dispatch's default
    #: (``--keepalive-s``)
    keep_alive_s: float = AUTOSCALE_DEFAULTS.keepalive_s
    #: Dispatch-wide function autoscaling settings (its ``--stable-window-s``
    #: etc.; the keep-alive is ``keep_alive_s``), merged with each
    #: function's spec as Dispatch merges them
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    #: system-specific overrides, e.g. {"galaxy": {"instances": 8}}.
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: a model per function from this size distribution (simulator/models.py;
    #: "": no models)
    models: str = ""


class Env:
    """One run's shared machinery, built fresh for each system."""

    def __init__(self, cfg: SimConfig, cal: Calibration, workload: Workload, seed: int) -> None:
        self.cfg = cfg
        self.cal = cal
        self.workload = workload
        self.sim = Sim()
        self.rng = random.Random(seed)
        self.net = Network(cfg.network, seed + 7)
        self.host = (
            Host(
                cfg.host_cores,
                cfg.host_slice_s,
                seed + 11,
                cfg.host_background,
                wakeup_s=cfg.host_wakeup_s,
                handoffs=cfg.host_handoffs,
                wake_cpu_s=cfg.host_wake_cpu_s,
            )
            if cfg.host_cores
            else None
        )
        self.cluster = Cluster(
            cfg.nodes,
            cfg.node_res,
            nodes_per_agent=cfg.nodes_per_agent,
            create_parallelism=cfg.create_parallelism,
            host=self.host,
        )
        self.rec = Recorder(workload.duration_s, workload.warmup_s)
        #: the functions' models and the nodes' caches (None: no models)
        self.models = (
            ModelSim(sizes_for(len(workload.functions), cfg.models, seed), lambda: self.sim.now)
            if cfg.models
            else None
        )
        #: every process of the system under test (``station``): its
        #: control plane and request routing, not node agents or sandboxes
        self.stations: list[Station] = []
        self.event_loops = cfg.host_event_loops and self.host is not None
        if self.event_loops:
            for agent in self.cluster.agents:
                agent.loop = EventLoop(self.sim, agent, *cfg.host_loop_steps)

    def station(self, name: str, c: int = 1, platform: bool = True) -> Station:
        """A process of this run (on the shared host when there is one);
        ``platform``: part of the system under test, counted in its CPU (not
        so a load generator)."""
        st = Station(name, c=c, host=self.host)
        if platform:
            self.stations.append(st)
        if self.event_loops:
            st.loop = EventLoop(self.sim, st, *self.cfg.host_loop_steps)
        return st

    def op(self, name: str, scale: float = 1.0) -> Callable[[], float]:
        """A sampler of a calibrated operation's service time."""
        return self.cal.sampler(name, self.rng, scale)


class Req:
    """A request waiting for a slot (the router's waiter token; a slotted
    record). Requests that get a slot at once are plain tuples
    (``simulator.frontend.Sent``)."""

    __slots__ = ("arrival", "duration", "fn", "owner")

    def __init__(self, fn: int, arrival: float, duration: float, owner: Any = None) -> None:
        self.fn = fn
        self.arrival = arrival
        self.duration = duration
        self.owner = owner


def need_of(f: FunctionDef) -> Res:
    """The resources one instance of f holds."""
    return Res(f.cpu_millis, f.memory_mib, f.gpus)


def _no_nonce() -> str:
    return ""


@mypyc_attr(allow_interpreted_subclasses=True)  # (the baselines' models)
class SystemModel:
    """Base of every model. Subclasses implement ``request`` and may use the
    shared data path below."""

    name = "system"
    #: requests one function's router lets wait (past it they fail:
    #: ``Frontend._wait``); unbounded unless the model has a bound
    max_queue = 10**9
    #: how long a request may wait for a slot (None: as long as it takes)
    wait_s: float | None = None

    def __init__(self, env: Env) -> None:
        self.env = env
        self.sim = env.sim
        self.net = env.net
        self.rec = env.rec
        self.fns = env.workload.functions
        self.needs = [need_of(f) for f in self.fns]
        self._ids = 0
        #: routers made so far (each gets its own lease prefix, see ``make_router``)
        self._routers = 0

    def start(self) -> None:
        """Schedule periodic work before the first arrival."""

    def request(self, fn: int, duration: float) -> None:
        """A request for function fn arrives now and runs for duration."""
        raise NotImplementedError

    def arrivals(self) -> Callable[[int, float], None]:
        """What the run calls for each arrival: ``request``, or the same
        thing with fewer calls in between."""
        return self.request

    def finish(self) -> None:
        """The run ended (last samples)."""

    def params(self) -> dict[str, Any]:
        """The model's parameters, for the report."""
        return {}

    def new_id(self, fn: int) -> str:
        """A unique instance id."""
        self._ids += 1
        return f"{self.fns[fn].name}-{self._ids}"

    def make_router(self, fn: int) -> FunctionRouter:
        """The production router for a function, on simulated time."""
        f = self.fns[fn]
        self._routers += 1
        # Lease ids only need to be unique here (no one forges a release in a
        # simulation): a prefix per router instead of the production random
        # nonce, which costs an os.urandom call per request. Nothing reads
        # a lease id but the router (and the handover), so results are the same.
        return FunctionRouter(
            f.name,
            f.concurrency,
            f.max_scale,
            self.sim.clock,
            max_queue=self.max_queue,  # refused past it (Frontend._wait)
            lease_ttl_s=1e9,
            lease_prefix=f"{self._routers}:",
            lease_nonce=_no_nonce,
        )

    def delete_on_node(self, node: SimNode, instance_id: str, service_s: float) -> None:
        """Ask node's agent to delete an instance (one hop, then its
        capacity is free)."""
        t = node.agent.finish(self.sim.now + self.net.hop(), service_s)
        self.sim.at(t, self._deleted, (node, instance_id))

    def _deleted(self, a: tuple[SimNode, str]) -> None:
        self.env.cluster.free(a[0], a[1])
        self.rec.count("instances_retired")


ModelFactory = Callable[[Env], SystemModel]
