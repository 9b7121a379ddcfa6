"""`galaxy serve controller`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import time
from pathlib import Path
from typing import Any

from controlplane.controller.actions import Changes, Timeouts
from controlplane.controller.actuators.base import Actuator, NoActuator
from controlplane.controller.actuators.cpulimit import parse_limits
from controlplane.controller.capacities import calibrated_capacities
from controlplane.controller.config import ControllerConfig, pairs
from controlplane.controller.coordinator import Coordinator
from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.leader import LeaderElector, LeaderInfo, ScaleLedger
from controlplane.controller.reconcile import Reconciler
from controlplane.controller.registry import WARM_AUDIENCE, ControlRegistry, wall_epoch_base
from controlplane.controller.scaling import ScalingConfig
from controlplane.controller.service import ControllerServicer
from controlplane.controller.tokens_store import TokenStore
from controlplane.runtime import access, authn, config
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.host import HostContext
from controlplane.runtime.membership import KIND_BY_NAME
from controlplane.runtime.quotas import NamespaceQuotas
from controlplane.runtime.rpc import ChannelPool
from galaxy.v1 import common_pb2, controller_pb2_grpc
from statestore import StateStore, StoreError, open_store
from statestore.leased import LeasedStore

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Controller flags (common ones are added by the CLI): one per
    ``ControllerConfig`` field (the bootstrap token's among them) and
    ``RpcConfig``'s token flags."""
    config.add_arguments(p, ControllerConfig)
    config.add_arguments(p, RpcConfig, config.TOKEN_FLAGS)


def _config(args: argparse.Namespace | ControllerConfig) -> ControllerConfig:
    if isinstance(args, ControllerConfig):
        return args
    return config.from_args(ControllerConfig, args)


def scaling_config(args: argparse.Namespace | ControllerConfig) -> ScalingConfig:
    """The policy configuration from flags and the calibration file."""
    c = _config(args)
    return c.scaling(calibrated_capacities(c.calibration))


def make_actuator(c: ControllerConfig, args: argparse.Namespace) -> Actuator:
    """The actuator named by --actuator (``args``: the common flags, for TLS)."""
    if c.actuator == "kubernetes":
        from controlplane.controller.actuators.kubernetes import KubernetesActuator

        token = Path(c.k8s_token_file).read_text().strip() if c.k8s_token_file else None
        return KubernetesActuator(
            namespace=c.k8s_namespace,
            api_url=c.k8s_api,
            token=token,
            deployments=pairs(c.k8s_deployment),
            verify_ssl=not c.k8s_insecure,
        )
    if c.actuator == "local":
        rpc = config.rpc_of(args)
        from controlplane.controller.actuators.local import LocalProcessActuator

        extra: dict[str, list[str]] = {}
        for item in c.instance_args:
            kind, flags = item.split("=", 1)
            extra.setdefault(kind, []).extend(shlex.split(flags))
        return LocalProcessActuator(
            host=c.instance_host,
            extra_args=extra,
            log_dir=Path(c.instance_log_dir) if c.instance_log_dir else None,
            cpu_limits=parse_limits(c.instance_cpu_limit),
            standby={k: int(n) for k, n in pairs(c.standby_instances).items()},
            # Instances serve as this controller does: its TLS directory (each
            # kind's own certificate there), or plaintext.
            tls_dir=None if rpc.insecure else rpc.tls_dir,
        )
    return NoActuator()


class ControllerComponent:
    """The controller as a host Component (it does not register with itself)."""

    kind = 0
    name = "controller"

    def __init__(self, args: argparse.Namespace) -> None:
        self.cfg = _config(args)
        if self.cfg.ha and self.cfg.state.startswith("memory"):
            raise SystemExit("galaxy: --ha needs a shared state store: --state etcd://HOST:PORT")
        self.args = args
        self.state_url: str = self.cfg.state
        self.store: StateStore | None = None
        self.mirror: LeasedStore | None = None
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
        a, c = self.args, self.cfg
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
        # The membership mirror (HA) is leased: a successor adopts it within
        # the lease, and after the whole control plane stops it does not
        # outlive MEMBERS_TTL_S (docs/state.md).
        self.mirror = LeasedStore(self.store, members_ttl_s(c.ha_ttl_s)) if c.ha else None
        coordinator = Coordinator(
            registry,
            pool,
            warm_timeout_s=c.warm_timeout_s,
            store=self.mirror,
            prefix=c.ha_prefix + "members/",
        )
        self.actuator = make_actuator(c, a)
        ledger = ScaleLedger(self.store, c.ha_prefix) if c.ha else None
        if c.ha:
            self.elector = LeaderElector(
                self.store,
                LeaderInfo(a.id, ""),
                prefix=c.ha_prefix,
                ttl_s=c.ha_ttl_s,
                on_change=self._leadership,
                prepare=self._take_over,
            )
        el = self.elector
        self.reconciler = Reconciler(
            registry,
            coordinator,
            self.actuator,
            scaling_config(c),
            changes,
            enabled=c.autoscale_control,
            ledger=ledger,
            leader_id=a.id,
            is_leader=(lambda: el.is_leader) if el else (lambda: True),
            term=(lambda: el.term) if el else (lambda: 0),
            tick_s=c.scale_tick_s,
            timeouts=Timeouts(
                drain_grace_s=c.drain_grace_s,
                drain_s=c.drain_timeout_s,
                member_silent_s=c.member_timeout_s,
            ),
        )
        self.tokens = TokenStore(self.store)
        rpc = config.rpc_of(a)
        self.authenticator = (
            authn.Authenticator(self.tokens.lookup, access.TokenCache(ttl_s=rpc.token_cache_s))
            if rpc.tokens_enabled()
            else None
        )
        self.servicer = ControllerServicer(
            registry,
            FunctionStore(
                self.store,
                max_functions=c.max_functions,
                max_instances_per_function=c.max_instances_per_function,
                max_reserved_instances=c.max_reserved_instances,
                quotas=NamespaceQuotas(c.quotas(), c.default_quota_fraction),
                egress_namespaces=c.egress_allowed(),
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
        if self.cfg.bootstrap_token_file and self.tokens is not None:
            await self.tokens.bootstrap(Path(self.cfg.bootstrap_token_file))
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
            kvs = await self.store.get_prefix(self.cfg.ha_prefix + "members/")
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
        if self.mirror is not None:
            # Not revoked: a follower taking over now still needs the mirror.
            await self.mirror.close()
        if self.store:
            await self.store.close()


def members_ttl_s(ha_ttl_s: float) -> float:
    """Lease of the HA membership mirror: long enough for any successor to
    be elected and read it (many leader TTLs), short enough that a stopped
    cluster's members are gone within a minute."""
    return max(60.0, 10 * ha_ttl_s)


def build(args: argparse.Namespace) -> ControllerComponent:
    """The controller component from parsed flags."""
    return ControllerComponent(args)
