"""What `galaxy up` starts: ``UpConfig``, the one place its defaults live
(the flags of `galaxy up` are derived from it; the node sizes are the node
agent's, ``NodeAgentConfig``, and the control function scaling settings
the controller's, ``ControllerConfig``, passed on to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from controlplane.controller.actuators.cpulimit import parse_limits
from controlplane.controller.config import ControllerConfig, KindCount, KindValue
from controlplane.controller.scaling import DEFAULT_MAX_INSTANCES
from controlplane.launch.endpoints import default_run_dir
from controlplane.nodeagent.config import NodeAgentConfig
from controlplane.runtime.config import Config, RpcConfig, same_as, setting
from functions.schedule.config import ScheduleConfig


def default_runtimes_dir() -> Path | None:
    """The repo's examples/runtimes, when this is a checkout that has it."""
    d = Path(__file__).resolve().parents[2] / "examples" / "runtimes"
    return d if d.is_dir() else None


def _cpu_limit(text: str) -> str:
    parse_limits([text])  # ValueError naming the value and the rule
    return text


def _none_if_empty(value: Any) -> Any:
    return value or None


CpuLimit = Annotated[str, AfterValidator(_cpu_limit)]
#: A directory, '' for none.
OptionalDir = Annotated[Path | None, BeforeValidator(_none_if_empty)]

SCALING = "control function autoscaling (docs/controller.md)"
_CTL = ControllerConfig
_AGENT = NodeAgentConfig.model_fields
#: What differs in a control plane a tool starts for itself (bench,
#: calibrate, burst, chaos, tests) from `galaxy up`'s, which serves a user:
#: no gateway, plaintext unless asked (``UpConfig.for_tool``).
TOOL_DEFAULTS: dict[str, Any] = {"gateway_port": -1, "tls": False}


#: ``UpConfig`` fields that are ``ControllerConfig``'s (up's name: the
#: controller's), handed on to `galaxy serve controller`.
TO_CONTROLLER = {
    **{f: f for f in ("t_df", "t_sf", "t_cmf", "calibration", "max_instances")},
    "scale_in_cooldown_s": "scale_in_cooldown_s",
    "standby": "standby_instances",
}


def _switch(cls: type[Config], name: str, off: str) -> Any:
    """An on/off switch of ``cls`` that `galaxy up` passes on: its default
    and rule are ``cls``'s; ``off`` says what turning it off does."""
    return same_as(
        cls, name, group=None, flag="--no-" + name.replace("_", "-"), help=f"ablation: {off}"
    )


def _agent(name: str, **changes: Any) -> Any:
    """A node agent setting, outside the node agent's flag group."""
    return same_as(NodeAgentConfig, name, group=None, **changes)


class UpConfig(Config):
    """What `galaxy up` starts: one flag per field, except ``run_dir`` (the
    global ``--run-dir``) and ``extra`` (code only)."""

    nodes: int = setting(4, "worker nodes", ge=0)
    sandbox: str = setting(
        _AGENT["sandbox"].default,
        "bwrap: real subprocesses, each in its own sandbox (default); process: real "
        "subprocesses isolating nothing (development only); emulated: no process",
        choices=("bwrap", "process", "emulated"),
    )
    nodes_per_agent: int = setting(
        0,
        "nodes hosted by one node agent process (default: 1 for bwrap and process sandboxes, "
        "105 for emulated)",
        ge=0,
    )
    dispatch: int = setting(1, "Dispatch instances", ge=0)
    schedule: int = setting(1, "Schedule instances", ge=0)
    clustermgr: int = setting(1, "ClusterMgr instances", ge=0)
    state: str = same_as(
        _CTL, "state", help="memory:// (default), etcd://host:port[,...] or etcds:// (TLS)"
    )
    #: Two leader-elected controllers. They share state: an etcd://
    #: ``state``, or with memory:// a local etcd child in RUN_DIR/etcd.
    ha: bool = setting(
        False,
        "two leader-elected controllers; needs --state etcd://... (without it, a local "
        "etcd is started in RUN_DIR/etcd if the etcd binary is installed)",
    )
    host: str = setting("127.0.0.1", "address every component listens on")
    #: Mutual TLS between every component and client (certificates made in
    #: RUN_DIR/certs on first start).
    tls: bool = setting(
        True,
        "no TLS: plaintext gRPC with no authentication (local experiments only)",
        flag="--insecure",
    )
    #: Bearer tokens on the public API, when TLS is on (RUN_DIR/token holds
    #: the admin's); none serves mutual TLS without tokens.
    auth: str = setting(
        "tokens",
        "bearer tokens on the public API and the gateway (default tokens; the admin "
        "token is written to RUN_DIR/token; off with --insecure)",
        choices=("tokens", "none"),
    )
    gateway_port: int = setting(
        8080,
        "HTTP port of the gateway (default 8080; 0: any free port; -1: no gateway)",
        ge=-1,
        le=65535,
    )
    graphs_dir: str = setting(
        "", "the gateway serves the inference graphs of this directory (docs/models.md)"
    )
    #: Fixed /metrics ports for a static Prometheus config: the supervisor
    #: gets the base, each child the next port in start order (a restarted
    #: child keeps its own). 0: any free port (RUN_DIR/prometheus/targets.json
    #: names them for file_sd either way).
    metrics_port_base: int = setting(
        0,
        "first of consecutive fixed /metrics ports (supervisor, then each process in start "
        "order); default 0: any free port, listed in RUN_DIR/prometheus/targets.json",
        ge=0,
        le=65000,
    )
    log_max_bytes: int = setting(
        10 * 1024 * 1024,
        "each process's log (RUN_DIR/logs/NAME.log) rotates at this size",
        ge=1024,
    )
    log_backups: int = setting(5, "rotated log files kept per process", ge=0, le=100)
    prometheus: bool = setting(
        False,
        "also start a local Prometheus (the `prometheus` binary, Debian package prometheus) "
        "scraping every process through RUN_DIR/prometheus/targets.json",
    )
    prometheus_port: int = setting(9090, "port of --prometheus's web UI and API", ge=0, le=65535)
    #: Serving runtime files (*.yaml) registered through the controller's
    #: API once it is ready, and again after it restarts (idempotent).
    runtimes: OptionalDir = setting(
        default_runtimes_dir(),
        "register the serving runtime files (*.yaml) of this directory at start "
        "(default: the repo's examples/runtimes; '' = none)",
    )
    # The ablation switches: each is declared once, by the component that
    # reads it (RpcConfig: every component; ScheduleConfig: Schedule), and
    # `galaxy up` hands it on (default and rule from there).
    connection_cache: bool = _switch(RpcConfig, "connection_cache", "a new gRPC channel per call")
    probe_cache: bool = _switch(ScheduleConfig, "probe_cache", "Schedule probes on every placement")
    locality: bool = setting(
        True,
        "ablation: Schedule places by load alone (scoring least_loaded, blind to the models "
        "nodes hold; on: model_locality)",
        flag="--no-locality",
    )
    agent_streams: bool = _switch(
        RpcConfig,
        "agent_streams",
        "a unary call per CreateInstance/DeleteInstance (no InstanceStream)",
    )
    stream_batches: bool = _switch(
        RpcConfig, "stream_batches", "one message per write on DispatchStream and InstanceStream"
    )
    heartbeat_batches: bool = _switch(
        RpcConfig, "heartbeat_batches", "one heartbeat message per node (no HeartbeatBatches)"
    )
    exact_partition: bool = _switch(
        ScheduleConfig,
        "exact_partition",
        "Schedule probes unless a cached probe answer fits (the G_n-CP step)",
    )
    #: capacity credits (Schedule lends, Dispatch uses); off: --no-credits to both
    credits: bool = _switch(
        ScheduleConfig, "credits", "no capacity credits (every start goes through Schedule)"
    )
    # Each node's capacity and the emulated cold start: the node agent's.
    node_cpu_millis: int = _agent("cpu_millis", flag="--node-cpu-millis")
    node_memory_mib: int = _agent("memory_mib", flag="--node-memory-mib")
    node_gpus: int = _agent("gpus", flag="--node-gpus")
    start_delay_ms: float = _agent("start_delay_ms")
    #: More `galaxy serve nodeagent` flags, for every agent, after the rest.
    agent_args: list[str] = setting(
        [],
        "any other `galaxy serve nodeagent` flag, for every agent, e.g. "
        "--agent-arg=--instance-egress-deny=169.254.0.0/16,10.0.0.0/8",
        flag="--agent-arg",
    )
    #: The controller scales the control functions, starting extra instances
    #: as its own children (local actuator); see docs/controller.md.
    autoscale_control: bool = same_as(
        _CTL,
        "autoscale_control",
        group=SCALING,
        help="the controller adds and removes Dispatch/Schedule/ClusterMgr instances on load",
    )
    # The controller's own settings, passed on (``Supervisor._controller_args``).
    t_df: float | None = same_as(_CTL, "t_df", group=SCALING)
    t_sf: float | None = same_as(_CTL, "t_sf", group=SCALING)
    t_cmf: float | None = same_as(_CTL, "t_cmf", group=SCALING)
    calibration: str | None = same_as(_CTL, "calibration", group=SCALING)
    max_instances: list[KindValue] = same_as(
        _CTL, "max_instances", group=SCALING, help=f"KIND=N (default {DEFAULT_MAX_INSTANCES})"
    )
    scale_in_cooldown_s: float = same_as(_CTL, "scale_in_cooldown_s", group=SCALING)
    standby: list[KindCount] = same_as(
        _CTL,
        "standby_instances",
        group=SCALING,
        flag="--standby",
        help="KIND=N warm standby instances kept started and promoted by a scale-out "
        "(no process start on its path); repeatable",
    )
    #: CPUs each control function process may use, by kind (like a pod's
    #: limits.cpu); a kind not named is unlimited.
    control_cpu_limit: list[CpuLimit] = setting(
        [],
        "[KIND=]CPUS a control function process may use (a cgroup, like a pod's "
        "limits.cpu); repeatable",
        group=SCALING,
    )
    #: More `galaxy serve controller` flags (e.g. --t-sf 200), after the rest.
    controller_args: list[str] = setting(
        [],
        "any other `galaxy serve controller` flag, e.g. --controller-arg=--high-watermark=0.7",
        flag="--controller-arg",
        group=SCALING,
    )
    run_dir: Path = Field(
        default_factory=default_run_dir,
        description="where endpoints.json, logs, certificates and the token are kept",
        json_schema_extra={"code_only": True},
    )
    #: More `galaxy serve KIND` flags, by kind.
    extra: dict[str, list[str]] = Field(
        default_factory=dict, description="", json_schema_extra={"code_only": True}
    )

    @classmethod
    def for_tool(cls, **values: Any) -> UpConfig:
        """A control plane a tool starts for itself: ``TOOL_DEFAULTS`` (no
        gateway, no TLS), then ``values``."""
        return cls(**{**TOOL_DEFAULTS, **values})

    @property
    def tokens(self) -> bool:
        """Bearer tokens on (with TLS)."""
        return self.auth == "tokens"

    def controller_settings(self) -> dict[str, Any]:
        """The ``ControllerConfig`` fields `galaxy up` passes on, by name."""
        return {ctl: getattr(self, up) for up, ctl in TO_CONTROLLER.items()}

    @property
    def control_cpu_limits(self) -> dict[str, float]:
        """CPUs per control function kind (``control_cpu_limit`` read)."""
        return parse_limits(self.control_cpu_limit)
