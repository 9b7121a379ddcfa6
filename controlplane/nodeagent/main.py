"""The node agent as a hostable component: command-line flags and ``build``.

The CLI adds these flags to its ``nodeagent`` subcommand and runs
``controlplane.runtime.host.serve(build(args), ...)``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from controlplane.nodeagent.orphans import OrphanReaper
from controlplane.nodeagent.registration import DEFAULT_HEARTBEAT_MS, Registrar
from controlplane.nodeagent.sandbox import (
    BACKENDS,
    DEFAULT_STARTUP_TIMEOUT_MS,
    SandboxBackend,
    make_sandbox_backend,
)
from controlplane.nodeagent.sandbox.cgroups import (
    DEFAULT_MAX_PIDS,
    CgroupError,
    Cgroups,
    open_cgroups,
)
from controlplane.nodeagent.service import DEFAULT_MAX_STARTING, SERVICE_NAME, NodeAgentServicer
from controlplane.runtime.host import HostContext
from controlplane.runtime.netaddr import split_host_port
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2, nodeagent_pb2_grpc

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the node agent's flags to p."""
    g = p.add_argument_group("node agent")
    g.add_argument("--nodes", type=int, default=1, help="nodes hosted by this agent (default 1)")
    g.add_argument("--node-prefix", default="node", help="node ids are PREFIX-INDEX")
    g.add_argument(
        "--node-index-start",
        type=int,
        default=0,
        help="index of the first node, so several agent processes get distinct ids (default 0)",
    )
    g.add_argument("--sandbox", choices=sorted(BACKENDS), default="process", help="sandbox backend")
    g.add_argument("--cpu-millis", type=int, default=4000, help="CPU per node, millicores")
    g.add_argument("--memory-mib", type=int, default=8192, help="memory per node, MiB")
    g.add_argument("--gpus", type=int, default=0, help="GPUs per node")
    g.add_argument(
        "--start-delay-ms",
        type=float,
        default=0.0,
        help="emulated sandbox: modelled cold-start delay (default 0)",
    )
    g.add_argument(
        "--startup-timeout-ms",
        type=int,
        default=DEFAULT_STARTUP_TIMEOUT_MS,
        help="process sandbox: readiness timeout when the spec sets none",
    )
    g.add_argument(
        "--heartbeat-ms",
        type=int,
        default=DEFAULT_HEARTBEAT_MS,
        help="heartbeat interval unless ClusterMgr asks for another",
    )
    g.add_argument(
        "--instance-user",
        default=None,
        help="process sandbox: run instances as this user (name or uid; needs a root agent "
        "and util-linux setpriv), never as the agent's own (often root) user",
    )
    g.add_argument(
        "--orphan-check-s",
        type=float,
        default=30.0,
        help="how often to ask the owning Dispatch instances which instances they route; "
        "one unknown in 2 checks in a row is stopped (0 = never; docs/reliability.md)",
    )
    g.add_argument(
        "--cgroups",
        choices=["auto", "on", "off"],
        default="auto",
        help="process sandbox: each instance in its own cgroup with its spec's CPU and "
        "memory as hard limits (auto: when cgroups can be made here, else a warning; "
        "on: refuse to start without them)",
    )
    g.add_argument(
        "--instance-max-pids",
        type=int,
        default=DEFAULT_MAX_PIDS,
        help="process sandbox with cgroups: at most N processes and threads per instance "
        f"(pids.max; a fork loop then fails in the instance; default {DEFAULT_MAX_PIDS}, "
        "0 = no limit). Without the pids controller --cgroups auto warns, on refuses",
    )
    g.add_argument(
        "--instance-dir",
        default=None,
        help="process sandbox: each instance gets a private directory (mode 0700, owned by "
        "--instance-user) under DIR as $HOME, $TMPDIR and, without a spec workdir, its cwd; "
        "removed when it ends (default: $TMPDIR/galaxy-instances-UID)",
    )
    g.add_argument(
        "--max-starting",
        type=int,
        default=DEFAULT_MAX_STARTING,
        help="instances starting at once on this agent; beyond, CreateInstance answers "
        f"RESOURCE_EXHAUSTED (default {DEFAULT_MAX_STARTING})",
    )
    g.add_argument(
        "--log-dir",
        default=None,
        help="process sandbox: where instances' stdout/stderr go (default: a temp dir)",
    )


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
    ) -> None:
        self.servicer = servicer
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
        self.servicer.attach(ctx.address, ctx.pool)
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
        if self.reaper is not None:
            await self.reaper.stop()
            self.reaper = None
        if self.registrar is not None:
            await self.registrar.stop()
            self.registrar = None
        await self.servicer.close()


def _cgroups(mode: str, max_pids: int) -> Cgroups | None:
    if max_pids < 0:
        raise ValueError("--instance-max-pids must be >= 0")
    try:
        return open_cgroups(mode, max_pids)
    except CgroupError as e:
        raise ValueError(f"--cgroups on: {e}") from None


def build(args: argparse.Namespace) -> NodeAgentComponent:
    """A NodeAgentComponent from the flags of ``add_arguments``."""
    if args.nodes < 1:
        raise ValueError("--nodes must be >= 1")
    if min(args.cpu_millis, args.memory_mib, args.gpus) < 0:
        raise ValueError("--cpu-millis, --memory-mib and --gpus must be >= 0")
    backend: SandboxBackend
    if args.sandbox == "emulated":
        backend = make_sandbox_backend("emulated", start_delay_ms=args.start_delay_ms)
    else:
        backend = make_sandbox_backend(
            args.sandbox,
            log_dir=args.log_dir,
            startup_timeout_ms=args.startup_timeout_ms,
            cgroups=_cgroups(args.cgroups, args.instance_max_pids),
            user=args.instance_user,
            instance_dir=args.instance_dir,
        )
    cap = Res(args.cpu_millis, args.memory_mib, args.gpus)
    ids = node_ids(args.node_prefix, args.nodes, args.node_index_start)
    servicer = NodeAgentServicer([(n, cap) for n in ids], backend, max_starting=args.max_starting)
    if args.orphan_check_s < 0:
        raise ValueError("--orphan-check-s must be >= 0")
    return NodeAgentComponent(
        servicer, heartbeat_interval_ms=args.heartbeat_ms, orphan_check_s=args.orphan_check_s
    )
