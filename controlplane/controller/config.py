"""The controller's configuration: the one place its defaults live (the
flags of `galaxy serve controller` are derived from it; the policy defaults
it repeats are read from the policy's own classes: ``ScalingConfig``,
``Timeouts``).

Flags of the form ``KIND=VALUE`` (``--min-instances schedule=2``) are
repeatable string fields whose items are checked by the flag's parser, so a
bad kind fails at parse time with the flag named; ``pairs`` reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator

from controlplane.controller.actions import Timeouts
from controlplane.controller.coordinator import WARM_TIMEOUT_S
from controlplane.controller.leader import DEFAULT_PREFIX, DEFAULT_TTL_S
from controlplane.controller.scaling import (
    DEFAULT_MAX_INSTANCES,
    KINDS,
    KindLimits,
    ScalingConfig,
)
from controlplane.runtime import validation
from controlplane.runtime.config import Config, setting
from controlplane.runtime.loadreport import BURST_INTERVAL_S
from controlplane.runtime.quotas import DEFAULT_FRACTION, Quota
from controlplane.runtime.quotas import parse as parse_quota

SCALING = "control function scaling (see docs/controller.md)"
K8S = "Kubernetes actuator"
HA = "high availability"
_POLICY: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ScalingConfig)}
_TIMEOUTS = Timeouts()


def _kind_value(text: str) -> str:
    kind, sep, _ = text.partition("=")
    if not sep or kind not in KINDS:
        raise ValueError(f"expected KIND=VALUE with KIND one of {KINDS}, got {text[:40]!r}")
    return text


def _quota(text: str) -> str:
    try:
        parse_quota(text)
    except ValueError as e:
        raise ValueError(str(e).removeprefix("--namespace-quota ")) from None
    return text


def _kind_count(text: str) -> str:
    _kind_value(text)
    n = text.partition("=")[2]
    if not n.isdigit():
        raise ValueError(f"expected KIND=N with N a whole number >= 0, got {text[:40]!r}")
    return text


def namespace_set(text: str) -> frozenset[str]:
    """Comma-separated namespace names (or ``*``) as a set."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    for n in names - {"*"}:
        if not validation.NAME_RE.fullmatch(n):
            raise ValueError(f"{n[:40]!r} is not a namespace name (a DNS-1123 label) or '*'")
    return names


def _namespaces(text: str) -> str:
    namespace_set(text)
    return text


KindValue = Annotated[str, AfterValidator(_kind_value)]
KindCount = Annotated[str, AfterValidator(_kind_count)]
QuotaText = Annotated[str, AfterValidator(_quota)]
NamespaceList = Annotated[str, AfterValidator(_namespaces)]


def pairs(items: list[str]) -> dict[str, str]:
    """``KIND=VALUE`` items as a mapping (a later item wins)."""
    return dict(item.split("=", 1) for item in items)  # type: ignore[misc]


class ControllerConfig(Config):
    """Cluster limits, control function scaling, its actuators and HA."""

    state: str = setting(
        "memory://",
        "state store URL: memory:// (embedded, default), etcd://host:port[,host:port] "
        "or etcds:// (TLS; GALAXY_ETCD_CA/_CERT/_KEY)",
    )
    max_functions: int = setting(
        validation.MAX_FUNCTIONS_DEFAULT,
        "functions the cluster may hold (bounds listings; see docs/security.md)",
    )
    max_instances_per_function: int = setting(
        validation.MAX_INSTANCES_PER_FUNCTION_DEFAULT,
        "largest max_scale/min_scale a spec may ask for (docs/security.md)",
    )
    max_reserved_instances: int = setting(
        validation.MAX_RESERVED_INSTANCES_DEFAULT,
        "min_scale of all functions together: instances kept running idle",
    )
    namespace_quota: list[QuotaText] = setting(
        [],
        "what the functions of namespace NS may claim, by their max_scale: keys "
        "functions, instances, cpu_millis, memory_mib, gpus; NS '*' = every namespace "
        "without its own (repeatable; docs/security.md, Quotas)",
        metavar="NS=KEY:N[,KEY:N]",
    )
    egress_namespaces: NamespaceList = setting(
        "*",
        "comma-separated namespaces whose functions may set egress: true (an outbound "
        "network from their sandboxes); '*' = every namespace, '' = none "
        "(docs/security.md, Egress)",
        metavar="NS[,NS]",
    )
    default_quota_fraction: float = setting(
        DEFAULT_FRACTION,
        "share of the cluster (registered nodes' CPU, memory, GPUs; --max-reserved-instances) "
        "the min_scale of one namespace's functions may hold when no --namespace-quota "
        "names it; 0 = no default (docs/security.md, Quotas)",
        ge=0.0,
        le=1.0,
    )
    autoscale_control: bool = setting(
        False,
        "scale Dispatch/Schedule/ClusterMgr instances on their load (default: observe only)",
        group=SCALING,
    )
    actuator: str = setting(
        "local",
        "how instances are started and stopped (local: child processes)",
        choices=("local", "kubernetes", "none"),
        group=SCALING,
    )
    calibration: str | None = setting(
        None,
        "T values from `galaxy calibrate` (default $GALAXY_CALIBRATION or "
        "~/.galaxy/calibration.json when present)",
        group=SCALING,
    )
    t_df: float | None = setting(None, "T of dispatch: ops/s of one instance", group=SCALING)
    t_sf: float | None = setting(None, "T of schedule: ops/s of one instance", group=SCALING)
    t_cmf: float | None = setting(None, "T of clustermgr: ops/s of one instance", group=SCALING)
    target_utilization: float = setting(_POLICY["target_utilization"], "", group=SCALING)
    high_watermark: float = setting(_POLICY["high_watermark"], "", group=SCALING)
    low_watermark: float = setting(_POLICY["low_watermark"], "", group=SCALING)
    scale_out_cooldown_s: float = setting(_POLICY["scale_out_cooldown_s"], "", group=SCALING)
    scale_in_cooldown_s: float = setting(
        _POLICY["scale_in_cooldown_s"],
        "seconds below the low watermark before scaling in (300, like HPA's "
        "downscale stabilization)",
        group=SCALING,
    )
    max_step_out: int | None = setting(
        _POLICY["max_step_out"],
        "instances added at most at once (default: no bound, straight to the needed count)",
        group=SCALING,
    )
    min_instances: list[KindValue] = setting([], "KIND=N", group=SCALING)
    max_instances: list[KindValue] = setting([], "KIND=N", group=SCALING)
    # As often as saturated instances report (loadreport.BURST_INTERVAL_S):
    # between reports a tick finds its inputs unchanged, and costs little.
    scale_tick_s: float = setting(
        BURST_INTERVAL_S, "decision period (load reports come sooner when saturated)",
        group=SCALING,
    )  # fmt: skip
    drain_grace_s: float = setting(_TIMEOUTS.drain_grace_s, "", group=SCALING)
    drain_timeout_s: float = setting(_TIMEOUTS.drain_s, "", group=SCALING)
    member_timeout_s: float = setting(
        _TIMEOUTS.member_silent_s, "silent instance removed", group=SCALING
    )
    warm_timeout_s: float = setting(WARM_TIMEOUT_S, "", group=SCALING)
    instance_args: list[KindValue] = setting(
        [], "local actuator: KIND='FLAGS' appended to `galaxy serve KIND`", group=SCALING
    )
    standby_instances: list[KindCount] = setting(
        [],
        "local actuator: KIND=N warm standby instances kept started, promoted by a "
        "scale-out without a process start (default: none)",
        group=SCALING,
    )
    instance_log_dir: str | None = setting(None, "local actuator: instance logs", group=SCALING)
    instance_host: str = setting("127.0.0.1", "local actuator: listen host", group=SCALING)
    instance_cpu_limit: list[str] = setting(
        [],
        "local actuator: [KIND=]CPUS per instance (a cgroup, like a pod's limits.cpu)",
        group=SCALING,
    )
    k8s_api: str | None = setting(None, "API server URL (default: in-cluster)", group=K8S)
    k8s_namespace: str = setting("default", "", group=K8S)
    k8s_token_file: str | None = setting(None, "bearer token for --k8s-api", group=K8S)
    k8s_deployment: list[KindValue] = setting([], "KIND=NAME", group=K8S)
    k8s_insecure: bool = setting(False, "do not verify the API server TLS", group=K8S)
    ha: bool = setting(False, "elect a leader among controllers (needs etcd state)", group=HA)
    ha_prefix: str = setting(DEFAULT_PREFIX, "key prefix of election and targets", group=HA)
    ha_ttl_s: float = setting(DEFAULT_TTL_S, "leader lease TTL, seconds", group=HA)
    bootstrap_token_file: str | None = setting(
        None,
        "a file holding an admin token (`galaxy tokens generate`) that this controller "
        "makes valid at start, so the first admin can get in (default "
        "$GALAXY_BOOTSTRAP_TOKEN_FILE; `galaxy up` writes RUN_DIR/token)",
        env="GALAXY_BOOTSTRAP_TOKEN_FILE",
    )

    def scaling(self, capacities: Mapping[str, float]) -> ScalingConfig:
        """The scaling policy's configuration: ``capacities`` (T per kind,
        from the calibration) unless ``--t-df``/``--t-sf``/``--t-cmf`` say
        otherwise, with these flags' limits and knobs. The controller and
        the simulator's Galaxy model both build it here."""
        overrides = {"dispatch": self.t_df, "schedule": self.t_sf, "clustermgr": self.t_cmf}
        mins, maxs = pairs(self.min_instances), pairs(self.max_instances)
        limits = {
            k: KindLimits(
                capacity=overrides[k] or capacities[k],
                min_instances=int(mins.get(k, 1)),
                max_instances=int(maxs.get(k, max(DEFAULT_MAX_INSTANCES, int(mins.get(k, 1))))),
            )
            for k in KINDS
        }
        return ScalingConfig(
            limits=limits,
            target_utilization=self.target_utilization,
            high_watermark=self.high_watermark,
            low_watermark=self.low_watermark,
            scale_out_cooldown_s=self.scale_out_cooldown_s,
            scale_in_cooldown_s=self.scale_in_cooldown_s,
            max_step_out=self.max_step_out,
        )

    def egress_allowed(self) -> frozenset[str]:
        """``--egress-namespaces`` as a set (``*``: every namespace)."""
        return namespace_set(self.egress_namespaces)

    def quotas(self) -> dict[str, Quota]:
        """``--namespace-quota`` items by namespace."""
        return dict(parse_quota(t) for t in self.namespace_quota)
