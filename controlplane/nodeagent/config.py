"""The node agent's configuration: the one place its defaults live (the
flags of `galaxy serve nodeagent`, `galaxy up`'s agents and the in-process
test cluster read them from here)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, field_validator

from controlplane.nodeagent import diskwatch, logkeep
from controlplane.nodeagent.entry import limits, routes
from controlplane.nodeagent.registration import DEFAULT_HEARTBEAT_MS
from controlplane.nodeagent.sandbox import BACKENDS, DEFAULT_STARTUP_TIMEOUT_MS, egressdeny
from controlplane.nodeagent.sandbox.cgroups import DEFAULT_MAX_PIDS
from controlplane.nodeagent.service import DEFAULT_MAX_STARTING
from controlplane.runtime.config import Config, setting

GROUP = "node agent"


def _networks(text: str) -> str:
    egressdeny.parse(text)
    return text


NetworkList = Annotated[str, AfterValidator(_networks)]


def _subnet(text: str) -> str:
    routes.parse_subnet(text)  # ValueError names the problem
    return text


RouteSubnet = Annotated[str, AfterValidator(_subnet)]


class NodeAgentConfig(Config):
    """The nodes one agent process hosts, and how it runs their instances."""

    nodes: int = setting(1, "nodes hosted by this agent", ge=1, group=GROUP)
    node_prefix: str = setting("node", "node ids are PREFIX-INDEX", min_length=1, group=GROUP)
    node_index_start: int = setting(
        0,
        "index of the first node, so several agent processes get distinct ids",
        group=GROUP,
    )
    sandbox: str = setting(
        "bwrap",
        "sandbox backend: bwrap isolates each instance (docs/security.md); process "
        "isolates nothing (development only); emulated runs no code",
        choices=tuple(sorted(BACKENDS)),
        group=GROUP,
    )
    cpu_millis: int = setting(4000, "CPU per node, millicores", ge=0, group=GROUP)
    memory_mib: int = setting(8192, "memory per node, MiB", ge=0, group=GROUP)
    gpus: int = setting(0, "GPUs per node", ge=0, group=GROUP)
    start_delay_ms: float = setting(0.0, "emulated sandbox: modelled cold-start delay", group=GROUP)
    startup_timeout_ms: int = setting(
        DEFAULT_STARTUP_TIMEOUT_MS,
        "process sandbox: readiness timeout when the spec sets none",
        group=GROUP,
    )
    heartbeat_ms: int = setting(
        DEFAULT_HEARTBEAT_MS, "heartbeat interval unless ClusterMgr asks for another", group=GROUP
    )
    instance_user: str | None = setting(
        None,
        "process sandbox: run instances as this user (name or uid; needs a root agent "
        "and util-linux setpriv), never as the agent's own (often root) user",
        group=GROUP,
    )
    instance_egress: bool = setting(
        True,
        "bwrap sandbox: give an instance whose spec sets egress an outbound network "
        "(slirp4netns; never the node's loopback); off: --no-instance-egress refuses "
        "such starts, naming the flag (docs/security.md, Egress)",
        group=GROUP,
    )
    instance_egress_deny: NetworkList = setting(
        egressdeny.DEFAULT,
        "bwrap sandbox: comma-separated networks an instance with egress may not reach "
        "(nftables in its network namespace; '' = none). The default is link-local "
        "IPv4 and AWS's IPv6 metadata address: clouds' metadata services, which hand "
        "out the node's credentials (docs/security.md, Egress)",
        metavar="CIDR[,CIDR]",
        group=GROUP,
    )
    entry_route_subnet: RouteSubnet = setting(
        routes.DEFAULT_SUBNET,
        "bwrap sandbox, root agent: the gateway's connections to an instance go "
        "through the kernel once its door admits them (no relay), over a veth pair "
        "on a /30 of this private subnet; '' = every connection through the door's "
        "relay (docs/security.md, The node's entry)",
        metavar="CIDR",
        group=GROUP,
    )
    entry_max_connections: int = setting(
        limits.MAX_CONNECTIONS,
        "bwrap sandbox: connections open at once across the instances' doors; more get "
        "a 503 and are closed (each holds two file descriptors: raise `ulimit -n` to match)",
        ge=1,
        le=1_000_000,
        group=GROUP,
    )
    entry_head_timeout_s: float = setting(
        limits.HEAD_S,
        "bwrap sandbox: a connection to an instance's door must show a request with a "
        "valid lease within this (408 and closed otherwise)",
        gt=0,
        le=3600,
        group=GROUP,
    )
    # 2.5 s: an orphan (two unknown checks in a row) lives at most ~5 s.
    # The price is one Dispatch.ListInstances per owning Dispatch per
    # period from each agent; raise it on clusters of many agents.
    orphan_check_s: float = setting(
        2.5,
        "how often to ask the owning Dispatch instances which instances they route; "
        "one unknown in 2 checks in a row is stopped (0 = never; docs/reliability.md)",
        ge=0,
        group=GROUP,
    )
    cgroups: str = setting(
        "auto",
        "process sandbox: each instance in its own cgroup with its spec's CPU and "
        "memory as hard limits (auto: when cgroups can be made here, else a warning; "
        "on: refuse to start without them)",
        choices=("auto", "on", "off"),
        group=GROUP,
    )
    cgroup_root: str = setting(
        "/sys/fs/cgroup",
        "where the agent makes its instances' cgroups: the cgroup v2 mount or a subtree "
        "delegated to the agent's user (v1: a directory with one entry per hierarchy, cpu, "
        "memory, pids); the Kubernetes DaemonSet's is delegated (docs/security.md)",
        group=GROUP,
    )
    instance_max_pids: int = setting(
        DEFAULT_MAX_PIDS,
        "process sandbox with cgroups: at most N processes and threads per instance "
        "(pids.max; a fork loop then fails in the instance; 0 = no limit). Without the "
        "pids controller --cgroups auto warns, on refuses",
        group=GROUP,
    )
    instance_disk_mib: int = setting(
        diskwatch.DEFAULT_DISK_MIB,
        "bwrap and process sandboxes: most an instance may keep in its private directory "
        "and logs when its spec sets no resources.disk_mib; one past its limit is killed, "
        "its exit naming it (0 = no limit but the spec's; docs/security.md)",
        ge=0,
        le=16_777_216,
        group=GROUP,
    )
    instance_disk_check_s: float = setting(
        diskwatch.DEFAULT_CHECK_S,
        "how often to measure every instance's private directory and logs against its limit "
        "(0 = never: no limit is enforced, no ended instance's logs are removed)",
        ge=0,
        le=3600,
        group=GROUP,
    )
    instance_logs_keep_mib: int = setting(
        logkeep.DEFAULT_KEEP_MIB,
        "bwrap and process sandboxes: the newest ended instances' stdout and stderr logs kept, "
        "up to N MiB in all (older ones are removed at the disk checks)",
        ge=0,
        le=16_777_216,
        group=GROUP,
    )
    instance_dir: str | None = setting(
        None,
        "process sandbox: each instance gets a private directory (mode 0700, owned by "
        "--instance-user) under DIR as $HOME, $TMPDIR and, without a spec workdir, its cwd; "
        "removed when it ends (default: $TMPDIR/galaxy-instances-UID)",
        metavar="DIR",
        group=GROUP,
    )
    log_dir: str | None = setting(
        None,
        "process sandbox: where instances' stdout/stderr go (default: a temp dir)",
        group=GROUP,
    )
    model_cache_dir: str | None = setting(
        None,
        "disk tier of the node's model cache (functions with a model: fetched here once, "
        "kept across restarts); unset: such functions are refused on this node",
        metavar="DIR",
        group=GROUP,
    )
    model_cache_disk_mib: int = setting(
        10_240, "capacity of the model cache's disk tier, MiB", ge=1, group=GROUP
    )
    model_cache_memory_dir: str | None = setting(
        None,
        "memory tier of the model cache: a directory on tmpfs (e.g. /dev/shm/galaxy-models); "
        "models used from disk are copied here when they fit",
        metavar="DIR",
        group=GROUP,
    )
    model_cache_memory_mib: int = setting(
        1024, "capacity of the model cache's memory tier, MiB", ge=1, group=GROUP
    )
    max_starting: int = setting(
        DEFAULT_MAX_STARTING,
        "instances starting at once on this agent; beyond, CreateInstance answers "
        "RESOURCE_EXHAUSTED",
        group=GROUP,
    )
    max_launching: int = setting(
        0,
        "process and bwrap sandboxes launched and awaited at once (0: one per CPU the "
        "agent may use); other starts wait their turn (their startup timeout begins "
        "at launch), so a burst of cold starts is not late all together",
        ge=0,
        group=GROUP,
    )

    @field_validator("instance_max_pids")
    @classmethod
    def _pids(cls, v: int) -> int:
        # Checked when the config is made, not by the flag's parser: a bad
        # value is the agent's ValueError naming the flag, as it always was.
        if v < 0:
            raise ValueError("must be >= 0")
        return v
