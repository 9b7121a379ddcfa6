"""The typed blocks of a bench file: ``ControlPlanePlan`` (the
``control_plane`` block) and ``LoadSettings`` (the ``load`` block and a
scenario's load keys). Their defaults live here and nowhere else; the
ones a bench shares with `galaxy up` (instance counts, ablation switches,
node sizes) are ``UpConfig``'s, and the heartbeat ClusterMgr's."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from controlplane.controller.config import ControllerConfig
from controlplane.launch.upconfig import UpConfig
from controlplane.runtime.config import Config, same_as, setting
from functions.clustermgr.config import ClusterMgrConfig


class ControlPlanePlan(Config):
    """The control plane a bench plan runs on (emulated sandboxes)."""

    dispatch: int = same_as(UpConfig, "dispatch")
    schedule: int = same_as(UpConfig, "schedule")
    clustermgr: int = same_as(UpConfig, "clustermgr")
    # The paper's cluster size (DESIGN.md), not `galaxy up`'s laptop default.
    nodes: int = setting(210, "worker nodes", ge=1)
    nodes_per_agent: int = same_as(UpConfig, "nodes_per_agent")
    state: str = setting("memory", "memory, etcd (a local etcd is started) or etcd://host:port")
    connection_cache: bool = same_as(UpConfig, "connection_cache")
    probe_cache: bool = same_as(UpConfig, "probe_cache")
    #: CreateInstance/DeleteInstance on a stream per node agent: the A/B switch
    agent_streams: bool = same_as(UpConfig, "agent_streams")
    stream_batches: bool = same_as(UpConfig, "stream_batches")
    #: node heartbeats batched per agent (HeartbeatBatches): the A/B switch
    heartbeat_batches: bool = same_as(UpConfig, "heartbeat_batches")
    #: capacity credits (Schedule lends, Dispatch creates directly): the A/B switch
    credits: bool = same_as(UpConfig, "credits")
    start_delay_ms: float = same_as(UpConfig, "start_delay_ms")
    node_cpu_millis: int = same_as(UpConfig, "node_cpu_millis")
    node_memory_mib: int = same_as(UpConfig, "node_memory_mib")
    #: Node heartbeat interval (ClusterMgr tells agents).
    heartbeat_ms: float = same_as(ClusterMgrConfig, "heartbeat_ms")
    #: every process freezes its start-up heap once ready
    #: (controlplane.runtime.gctune); false runs the interpreter's defaults
    gc_tuning: bool = setting(True, "freeze every process's start-up heap (GcConfig)")
    #: with gc_tuning: the young-generation threshold of every process
    #: (None: GcConfig's default; 0: the interpreter's own thresholds)
    gc_threshold0: int | None = setting(None, "young-generation GC threshold (sweeps)", ge=0)
    #: Functions the controller may hold (--max-functions): every plan of a
    #: bench file deploys its own pool into the same cluster.
    max_functions: int = same_as(ControllerConfig, "max_functions")
    n: int = setting(2, "instances of each control function of the G_n presets", ge=1)


class LoadSettings(Config):
    """How one plan drives load: the ``load`` block, then scenario keys,
    then parameters."""

    seed: int = setting(1, "seed of arrivals and cold/warm choices")
    echo_requests: int = setting(4000, "requests of the plain-gRPC echo yardstick", ge=0)
    echo_max_s: float = setting(3.0, "the echo yardstick's time limit, seconds", gt=0)
    echo_same_rate: bool = setting(
        True,
        "open-loop plans: also send the raw echo the plan's own arrival schedule (its "
        "latency at the same rate is this machine's floor for one RPC)",
    )
    mode: str = setting(
        "open",
        "open: arrivals on schedule; closed: `concurrency` workers back to back",
        choices=("open", "closed"),
    )
    concurrency: int = setting(16, "requests in flight at most", ge=1)
    cold_fraction: float = setting(0.0, "share of requests to a cold function", ge=0, le=1)
    arrival_rate: float = setting(10.0, "open loop: requests per second", gt=0)
    timeout_s: float = setting(10.0, "deadline of one request, seconds", gt=0)
    max_duration_s: float = setting(120.0, "a plan stops after this long, seconds", gt=0)
    cold_functions: int = setting(256, "functions of the cold pool (concurrency 1)", ge=0)
    warm_functions: int = setting(32, "functions of the warm pool", ge=0)
    warm_concurrency: int = setting(1000, "concurrency of a warm function", ge=1)
    warm_hold_ms: float = setting(0.0, "how long a warm request keeps its lease", ge=0)
    #: the SDK's DispatchStream per Dispatch instance (false: a unary call
    #: per request): the A/B switch of the stream
    dispatch_streams: bool = setting(True, "Dispatch requests as messages on one stream")
    #: (scenario, fraction): open-loop rate as a fraction of an earlier
    #: scenario's achieved throughput in the same configuration
    rate_of: tuple[str, float] | None = setting(None, "", cli=False)


#: The keys of the ``load`` block and their defaults.
LOAD_BLOCK = ("seed", "echo_requests", "echo_max_s", "concurrency", "timeout_s", "max_duration_s")


def defaults(cls: type[Config], keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The defaults of ``cls``'s fields (of ``keys``, when given)."""
    return {k: f.default for k, f in cls.model_fields.items() if keys is None or k in keys}


def first_error(e: ValidationError) -> tuple[str, str]:
    """(field, message) of a validation error's first complaint."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return loc, str(err["msg"]).removeprefix("Value error, ")
