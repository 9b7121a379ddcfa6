"""`galaxy serve controller`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

from controlplane.controller.actions import Changes, Timeouts
from controlplane.controller.actuators.base import Actuator, NoActuator
from controlplane.controller.actuators.cpulimit import parse_limits
from controlplane.controller.capacities import calibrated_capacities
from controlplane.controller.coordinator import Coordinator
from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.leader import DEFAULT_PREFIX, LeaderElector, LeaderInfo, ScaleLedger
from controlplane.controller.reconcile import Reconciler
from controlplane.controller.registry import WARM_AUDIENCE, ControlRegistry, wall_epoch_base
from controlplane.controller.scaling import KINDS, KindLimits, ScalingConfig
from controlplane.controller.service import ControllerServicer
from controlplane.controller.tokens_store import TokenStore
from controlplane.runtime import access, authn, validation
from controlplane.runtime.host import HostContext
from controlplane.runtime.membership import KIND_BY_NAME
from controlplane.runtime.quotas import NamespaceQuotas, Quota
from controlplane.runtime.quotas import parse as parse_quota
from controlplane.runtime.rpc import ChannelPool
from galaxy.v1 import common_pb2, controller_pb2_grpc
from statestore import StateStore, StoreError, open_store

log = logging.getLogger(__name__)


def _kv(s: str) -> tuple[str, str]:
    kind, sep, value = s.partition("=")
    if not sep or kind not in KINDS:
        raise argparse.ArgumentTypeError(f"expected KIND=VALUE with KIND one of {KINDS}, got {s!r}")
    return kind, value


def _quota(text: str) -> tuple[str, Quota]:
    try:
        return parse_quota(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--namespace-quota ")) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Controller flags (common ones are added by the CLI)."""
    p.add_argument(
        "--state",
        default="memory://",
        help="state store URL: memory:// (embedded, default) or etcd://host:port[,host:port]",
    )
    p.add_argument(
        "--max-functions",
        type=int,
        default=validation.MAX_FUNCTIONS_DEFAULT,
        help="functions the cluster may hold (bounds listings; see docs/security.md)",
    )
    p.add_argument(
        "--max-instances-per-function",
        type=int,
        default=validation.MAX_INSTANCES_PER_FUNCTION_DEFAULT,
        help="largest max_scale/min_scale a spec may ask for (docs/security.md)",
    )
    p.add_argument(
        "--max-reserved-instances",
        type=int,
        default=validation.MAX_RESERVED_INSTANCES_DEFAULT,
        help="min_scale of all functions together: instances kept running idle",
    )
    p.add_argument(
        "--namespace-quota",
        action="append",
        type=_quota,
        default=[],
        metavar="NS=KEY:N[,KEY:N]",
        help="what the functions of namespace NS may claim, by their max_scale: keys "
        "functions, instances, cpu_millis, memory_mib, gpus; NS '*' = every namespace "
        "without its own (repeatable; docs/security.md, Quotas)",
    )
    authn.add_arguments(p)
    p.add_argument(
        "--bootstrap-token-file",
        default=os.environ.get("GALAXY_BOOTSTRAP_TOKEN_FILE"),
        help="a file holding an admin token (`galaxy tokens generate`) that this controller "
        "makes valid at start, so the first admin can get in (default "
        "$GALAXY_BOOTSTRAP_TOKEN_FILE; `galaxy up` writes RUN_DIR/token)",
    )
    g = p.add_argument_group("control function scaling (see docs/controller.md)")
    g.add_argument(
        "--autoscale-control",
        action="store_true",
        help="scale Dispatch/Schedule/ClusterMgr instances on their load (default: observe only)",
    )
    g.add_argument(
        "--actuator",
        choices=["local", "kubernetes", "none"],
        default="local",
        help="how instances are started and stopped (default local: child processes)",
    )
    g.add_argument(
        "--calibration",
        default=None,
        help="T values from `galaxy calibrate` (default $GALAXY_CALIBRATION or "
        "~/.galaxy/calibration.json when present)",
    )
    for kind, flag in (("dispatch", "--t-df"), ("schedule", "--t-sf"), ("clustermgr", "--t-cmf")):
        g.add_argument(flag, type=float, default=None, help=f"T of {kind}: ops/s of one instance")
    g.add_argument("--target-utilization", type=float, default=0.6)
    g.add_argument("--high-watermark", type=float, default=0.8)
    g.add_argument("--low-watermark", type=float, default=0.3)
    g.add_argument("--scale-out-cooldown-s", type=float, default=2.0)
    g.add_argument(
        "--scale-in-cooldown-s",
        type=float,
        default=300.0,
        help="seconds below the low watermark before scaling in (300, like HPA's "
        "downscale stabilization)",
    )
    g.add_argument(
        "--max-step-out",
        type=int,
        default=None,
        help="instances added at most at once (default: no bound, straight to the needed count)",
    )
    g.add_argument("--min-instances", type=_kv, action="append", default=[], help="KIND=N")
    g.add_argument("--max-instances", type=_kv, action="append", default=[], help="KIND=N")
    g.add_argument("--scale-tick-s", type=float, default=1.0, help="decision period")
    g.add_argument("--drain-grace-s", type=float, default=1.0)
    g.add_argument("--drain-timeout-s", type=float, default=15.0)
    g.add_argument("--member-timeout-s", type=float, default=5.0, help="silent instance removed")
    g.add_argument("--warm-timeout-s", type=float, default=5.0)
    g.add_argument(
        "--instance-args",
        type=_kv,
        action="append",
        default=[],
        help="local actuator: KIND='FLAGS' appended to `galaxy serve KIND`",
    )
    g.add_argument("--instance-log-dir", default=None, help="local actuator: instance logs")
    g.add_argument("--instance-host", default="127.0.0.1", help="local actuator: listen host")
    g.add_argument(
        "--instance-cpu-limit",
        action="append",
        default=[],
        help="local actuator: [KIND=]CPUS per instance (a cgroup, like a pod's limits.cpu)",
    )
    k = p.add_argument_group("Kubernetes actuator")
    k.add_argument("--k8s-api", default=None, help="API server URL (default: in-cluster)")
    k.add_argument("--k8s-namespace", default="default")
    k.add_argument("--k8s-token-file", default=None, help="bearer token for --k8s-api")
    k.add_argument("--k8s-deployment", type=_kv, action="append", default=[], help="KIND=NAME")
    k.add_argument("--k8s-insecure", action="store_true", help="do not verify the API server TLS")
    h = p.add_argument_group("high availability")
    h.add_argument(
        "--ha", action="store_true", help="elect a leader among controllers (needs etcd state)"
    )
    h.add_argument("--ha-prefix", default=DEFAULT_PREFIX, help="key prefix of election and targets")
    h.add_argument("--ha-ttl-s", type=float, default=3.0, help="leader lease TTL, seconds")


def scaling_config(args: argparse.Namespace) -> ScalingConfig:
    """The policy configuration from flags and the calibration file."""
    caps = calibrated_capacities(args.calibration)
    overrides = {"dispatch": args.t_df, "schedule": args.t_sf, "clustermgr": args.t_cmf}
    mins, maxs = dict(args.min_instances), dict(args.max_instances)
    limits = {
        k: KindLimits(
            capacity=overrides[k] or caps[k],
            min_instances=int(mins.get(k, 1)),
            max_instances=int(maxs.get(k, max(8, int(mins.get(k, 1))))),
        )
        for k in KINDS
    }
    return ScalingConfig(
        limits=limits,
        target_utilization=args.target_utilization,
        high_watermark=args.high_watermark,
        low_watermark=args.low_watermark,
        scale_out_cooldown_s=args.scale_out_cooldown_s,
        scale_in_cooldown_s=args.scale_in_cooldown_s,
        max_step_out=args.max_step_out,
    )


def make_actuator(args: argparse.Namespace) -> Actuator:
    """The actuator named by --actuator."""
    if args.actuator == "kubernetes":
        from controlplane.controller.actuators.kubernetes import KubernetesActuator

        token = Path(args.k8s_token_file).read_text().strip() if args.k8s_token_file else None
        return KubernetesActuator(
            namespace=args.k8s_namespace,
            api_url=args.k8s_api,
            token=token,
            deployments=dict(args.k8s_deployment),
            verify_ssl=not args.k8s_insecure,
        )
    if args.actuator == "local":
        from controlplane.controller.actuators.local import LocalProcessActuator

        extra: dict[str, list[str]] = {}
        for kind, flags in args.instance_args:
            extra.setdefault(kind, []).extend(shlex.split(flags))
        return LocalProcessActuator(
            host=args.instance_host,
            extra_args=extra,
            log_dir=Path(args.instance_log_dir) if args.instance_log_dir else None,
            cpu_limits=parse_limits(args.instance_cpu_limit),
            # Instances serve as this controller does: its TLS directory (each
            # kind's own certificate there), or plaintext.
            tls_dir=None if getattr(args, "insecure", False) else getattr(args, "tls_dir", None),
        )
    return NoActuator()


class ControllerComponent:
    """The controller as a host Component (it does not register with itself)."""

    kind = 0
    name = "controller"

    def __init__(self, args: argparse.Namespace) -> None:
        if args.ha and args.state.startswith("memory"):
            raise SystemExit("galaxy: --ha needs a shared state store: --state etcd://HOST:PORT")
        self.args = args
        self.state_url: str = args.state
        self.store: StateStore | None = None
        self.servicer: ControllerServicer | None = None
        self.tokens: TokenStore | None = None
        self.authenticator: authn.Authenticator | None = None
        self.reconciler: Reconciler | None = None
        self.elector: LeaderElector | None = None
        self.actuator: Actuator = NoActuator()
        self._tasks: set[asyncio.Task[Any]] = set()

    def services(self) -> list[tuple[Any, Any, str]]:
        """The Controller service (everything is built on first call)."""
        if self.servicer is None:
            self._build()
        return [
            (
                controller_pb2_grpc.add_ControllerServicer_to_server,
                self.servicer,
                "galaxy.v1.Controller",
            )
        ]

    def _build(self) -> None:
        a = self.args
        self.store = open_store(self.state_url)
        changes = Changes()
        # Epochs from the wall clock: after a restart (no HA, nothing stored)
        # components must not ignore the new controller as older.
        registry = ControlRegistry(
            warm_kinds=WARM_AUDIENCE,
            on_change=changes.notify,
            epoch_base=wall_epoch_base(time.time()),
        )
        # The pool is replaced with the host's in start(); these objects must
        # exist before the server is built.
        pool = ChannelPool()
        coordinator = Coordinator(
            registry,
            pool,
            warm_timeout_s=a.warm_timeout_s,
            store=self.store if a.ha else None,
            prefix=a.ha_prefix + "members/",
        )
        self.actuator = make_actuator(a)
        ledger = ScaleLedger(self.store, a.ha_prefix) if a.ha else None
        if a.ha:
            self.elector = LeaderElector(
                self.store,
                LeaderInfo(a.id, ""),
                prefix=a.ha_prefix,
                ttl_s=a.ha_ttl_s,
                on_change=self._leadership,
                prepare=self._take_over,
            )
        el = self.elector
        self.reconciler = Reconciler(
            registry,
            coordinator,
            self.actuator,
            scaling_config(a),
            changes,
            enabled=a.autoscale_control,
            ledger=ledger,
            leader_id=a.id,
            is_leader=(lambda: el.is_leader) if el else (lambda: True),
            term=(lambda: el.term) if el else (lambda: 0),
            tick_s=a.scale_tick_s,
            timeouts=Timeouts(
                drain_grace_s=a.drain_grace_s,
                drain_s=a.drain_timeout_s,
                member_silent_s=a.member_timeout_s,
            ),
        )
        self.tokens = TokenStore(self.store)
        self.authenticator = (
            authn.Authenticator(self.tokens.lookup, access.TokenCache(ttl_s=a.token_cache_s))
            if authn.enabled(a)
            else None
        )
        self.servicer = ControllerServicer(
            registry,
            FunctionStore(
                self.store,
                max_functions=a.max_functions,
                max_instances_per_function=a.max_instances_per_function,
                max_reserved_instances=a.max_reserved_instances,
                quotas=NamespaceQuotas(dict(a.namespace_quota)),
            ),
            pool,
            coordinator=coordinator,
            reconciler=self.reconciler,
            elector=self.elector,
            controller_id=a.id,
            tokens=self.tokens,
            authenticator=self.authenticator,
        )

    async def start(self, ctx: HostContext) -> None:
        """Adopt the host's pool and address; start pushing, reconciling and,
        with --ha, campaigning."""
        assert self.servicer is not None and self.reconciler is not None
        self.servicer.pool = ctx.pool
        self.servicer.address = ctx.address
        if self.args.bootstrap_token_file and self.tokens is not None:
            await self.tokens.bootstrap(Path(self.args.bootstrap_token_file))
        self.actuator.on_lost = self._instance_lost
        await self.actuator.start(ctx.address)
        self.servicer.start()
        self.reconciler.start()
        if self.elector is not None:
            self.elector.me = LeaderInfo(self.args.id, ctx.address)
            self.elector.start()
        ctx.extra["state"] = self.state_url

    def _leadership(self, leading: bool) -> None:
        assert self.reconciler is not None
        if not leading:
            self.reconciler.deposed()

    async def _take_over(self) -> None:
        # A new leader starts from the membership and targets its
        # predecessor left in the store, above its predecessor's epochs.
        # Awaited by the elector before this controller counts as leader:
        # until then it answers no call (a membership read from the empty
        # registry made the SDK fail with FAILED_PRECONDITION) and decides
        # nothing (a decision before adopting could repeat the last one).
        assert self.servicer is not None and self.reconciler is not None and self.elector
        assert self.store is not None
        try:
            kvs = await self.store.get_prefix(self.args.ha_prefix + "members/")
            infos = [common_pb2.ControlInstance.FromString(kv.value) for kv in kvs]
            base = max(self.elector.term << 20, wall_epoch_base(time.time()))
            self.servicer.registry.seed(infos, epoch_base=base)
            await self.reconciler.adopt()
        except StoreError as e:
            log.warning("taking over as leader: state store: %s", e)
        self.servicer.coordinator.mark_dirty()

    def _instance_lost(self, kind: str, instance_id: str) -> None:
        """An instance the actuator started died: out of membership now, so
        its partitions move at once (not after the silence timeout); the
        reconciler then starts a replacement if the kind is below its
        minimum."""
        servicer = self.servicer
        code = KIND_BY_NAME.get(kind)
        if servicer is None or code is None or servicer.registry.get(code, instance_id) is None:
            return
        log.warning("%s %s died: removed from membership", kind, instance_id)
        if servicer.registry.deregister(code, instance_id):
            servicer.coordinator.mark_dirty()

    def on_membership(self, membership: common_pb2.Membership) -> None:
        """Not registered, so never called."""

    async def stop(self) -> None:
        """Resign leadership, stop background work and the instances the
        local actuator started."""
        if self.elector is not None:
            await self.elector.stop(resign=True)
        for t in list(self._tasks):
            t.cancel()
        if self.reconciler is not None:
            await self.reconciler.stop()
        if self.servicer:
            await self.servicer.stop()
        await self.actuator.close()
        if self.store:
            await self.store.close()


def build(args: argparse.Namespace) -> ControllerComponent:
    """The controller component from parsed flags."""
    return ControllerComponent(args)
