"""The node agent as a hostable component: command-line flags and ``build``.

The CLI adds these flags to its ``nodeagent`` subcommand and runs
``controlplane.runtime.host.serve(build(args), ...)``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.nodeagent.config import NodeAgentConfig
from controlplane.nodeagent.diskwatch import DiskWatch
from controlplane.nodeagent.entry import netns, routes
from controlplane.nodeagent.entry.limits import EntryLimits, raise_fd_limit
from controlplane.nodeagent.entry.routing import Routes
from controlplane.nodeagent.modelcache import ModelCache, Tier
from controlplane.nodeagent.orphans import OrphanReaper
from controlplane.nodeagent.registration import DEFAULT_HEARTBEAT_MS, Registrar
from controlplane.nodeagent.sandbox import SandboxBackend, egressdeny, make_sandbox_backend
from controlplane.nodeagent.sandbox.cgroups import CgroupError, Cgroups, open_cgroups
from controlplane.nodeagent.service import SERVICE_NAME, NodeAgentServicer
from controlplane.runtime import config, leasetoken
from controlplane.runtime.host import HostContext
from controlplane.runtime.metrics import QUEUE_LIMIT
from controlplane.runtime.netaddr import split_host_port
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2, nodeagent_pb2_grpc

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the node agent's flags to p (one per ``NodeAgentConfig`` field)."""
    config.add_arguments(p, NodeAgentConfig)


def node_ids(prefix: str, count: int, start: int = 0) -> list[str]:
    """The ids of a pool: PREFIX-START .. PREFIX-(START+COUNT-1)."""
    return [f"{prefix}-{i}" for i in range(start, start + count)]


class NodeAgentComponent:
    """A node pool served by one process; satisfies ``controlplane.runtime.host.Component``.

    Node agents do not register as control instances (kind 0); they register
    their nodes with ClusterMgr instead (``Registrar``).
    """

    kind = 0
    #: Name the host prints in its ready line and logs.
    name = "nodeagent"

    def __init__(
        self,
        servicer: NodeAgentServicer,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_MS,
        orphan_check_s: float = 0.0,
        routes: Routes | None = None,
        disk_watch: DiskWatch | None = None,
    ) -> None:
        self.servicer = servicer
        #: Private directories measured against their limits (started with
        #: the agent, whether or not it registers).
        self.disk_watch = disk_watch
        #: Routed entries (the bwrap sandbox of a root agent): tables made at
        #: start, removed at stop.
        self.routes = routes
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.orphan_check_s = orphan_check_s
        self.registrar: Registrar | None = None
        self.reaper: OrphanReaper | None = None

    def services(self) -> list[tuple[Callable[[Any, Any], None], Any, str]]:
        return [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, self.servicer, SERVICE_NAME)]

    async def start(self, ctx: HostContext) -> None:
        # Instances listen on the node's own address (the one this agent
        # advertises), never loopback: clients on other hosts call them.
        self.servicer.backend.host = split_host_port(ctx.address)[0]
        if self.routes is not None:
            why = self.routes.start(self.servicer.backend.host)
            if why is not None:
                log.warning("node entry: no routed entries, every door relays: %s", why)
        self.servicer.attach(ctx.address, ctx.pool)
        if self.disk_watch is not None:
            self.disk_watch.start()
        ids = list(self.servicer.nodes)
        ctx.extra["nodes"] = ids
        if not ctx.controller:
            log.info("no controller given: nodes %s are not registered", ids)
            return
        self.registrar = Registrar(
            ids,
            self.servicer.heartbeat_status,
            ctx.controller,
            ctx.pool,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
        )
        # Frees reach the owning Schedule instance now, not at the next
        # heartbeat: its view of the partition is exact up to unseen frees.
        self.servicer.on_freed = self.registrar.report_soon
        await self.registrar.start()
        if self.orphan_check_s > 0:
            registrar = self.registrar
            self.reaper = OrphanReaper(
                self.servicer, lambda: registrar.view, ctx.pool, period_s=self.orphan_check_s
            )
            self.reaper.start()

    def on_membership(self, membership: common_pb2.Membership) -> None:
        pass  # never registers as a control instance, so never called

    async def stop(self) -> None:
        if self.disk_watch is not None:
            await self.disk_watch.stop()
        if self.reaper is not None:
            await self.reaper.stop()
            self.reaper = None
        if self.registrar is not None:
            await self.registrar.stop()
            self.registrar = None
        await self.servicer.close()
        if self.routes is not None:
            self.routes.stop()


def _cgroups(mode: str, max_pids: int, root: str) -> Cgroups | None:
    try:
        return open_cgroups(mode, max_pids, Path(root))
    except CgroupError as e:
        raise ValueError(f"--cgroups on: {e}") from None


def _models(cfg: NodeAgentConfig) -> ModelCache | None:
    """The model cache the flags ask for (memory tier first), or None."""
    if not cfg.model_cache_dir:
        return None
    mib = 1024 * 1024
    tiers = [Tier("disk", Path(cfg.model_cache_dir), cfg.model_cache_disk_mib * mib)]
    if cfg.model_cache_memory_dir:
        tiers.insert(
            0, Tier("memory", Path(cfg.model_cache_memory_dir), cfg.model_cache_memory_mib * mib)
        )
    return ModelCache(tiers)


def build(args: argparse.Namespace) -> NodeAgentComponent:
    """A NodeAgentComponent from the flags of ``add_arguments``."""
    cfg = config.from_args(NodeAgentConfig, args)
    backend: SandboxBackend
    route: Routes | None = None
    if cfg.sandbox == "emulated":
        backend = make_sandbox_backend("emulated", start_delay_ms=cfg.start_delay_ms)
    else:
        # The bwrap sandbox's entry checks leases with the cluster's key.
        entry: dict[str, object] = {}
        if cfg.sandbox == "bwrap":
            subnet = routes.parse_subnet(cfg.entry_route_subnet)
            if subnet is not None and netns.can_enter():
                # A start offset of its own: agents of one host rarely collide.
                route = Routes(routes.RoutePool(subnet, start=os.getpid()))
            entry = {
                "routes": route,
                "lease_key": leasetoken.from_args(args),
                "allow_egress": cfg.instance_egress,
                "egress_deny": egressdeny.parse(cfg.instance_egress_deny),
                "entry_limits": EntryLimits(cfg.entry_max_connections, cfg.entry_head_timeout_s),
            }
        backend = make_sandbox_backend(
            cfg.sandbox,
            log_dir=cfg.log_dir,
            startup_timeout_ms=cfg.startup_timeout_ms,
            cgroups=_cgroups(cfg.cgroups, cfg.instance_max_pids, cfg.cgroup_root),
            user=cfg.instance_user,
            instance_dir=cfg.instance_dir,
            **entry,
        )
    cap = Res(cfg.cpu_millis, cfg.memory_mib, cfg.gpus)
    ids = node_ids(cfg.node_prefix, cfg.nodes, cfg.node_index_start)
    servicer = NodeAgentServicer(
        [(n, cap) for n in ids],
        backend,
        max_starting=cfg.max_starting,
        models=_models(cfg),
        max_launching=cfg.max_launching,
    )
    QUEUE_LIMIT.labels("galaxy_nodeagent_pending_creates").set(cfg.max_starting)
    if cfg.sandbox == "bwrap":
        QUEUE_LIMIT.labels("galaxy_entry_open_connections").set(cfg.entry_max_connections)
        short = raise_fd_limit(cfg.entry_max_connections)
        if short is not None:
            log.warning("node entry: %s", short)
    return NodeAgentComponent(
        servicer,
        heartbeat_interval_ms=cfg.heartbeat_ms,
        orphan_check_s=cfg.orphan_check_s,
        routes=route,
        disk_watch=DiskWatch(
            servicer, cfg.instance_disk_mib, cfg.instance_disk_check_s, cfg.instance_logs_keep_mib
        )
        if cfg.instance_disk_check_s > 0 and cfg.sandbox != "emulated"
        else None,
    )
