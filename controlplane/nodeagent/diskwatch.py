"""The disk limit (``resources.disk_mib``): what an instance keeps on the
node's disk, its private directory ($HOME and $TMPDIR) and its stdout and
stderr logs (which the kubelet counts in a pod's ephemeral storage too), is
measured every few seconds, and an instance past its limit is killed, as the
kernel kills one past its memory limit; its exit reason names the limit.

Why: a tenant filling the node's disk stops every other tenant's writes and
the control plane's own (etcd's data, the logs). Measured as the kubelet
measures ephemeral storage where it has no filesystem quota: by walking the
tree. Each entry counts at least one 4 KiB block (a million empty files take
a million inodes, and count 3.9 GiB); a sparse file counts the blocks it
holds, not its length; the walk stops once past the limit, so its cost is
bounded by the limit. Not counted: a file deleted while a process holds it
open (a filesystem quota would count it; none is used, since none is there
on every node). The sandbox's ``/tmp`` and ``/dev/shm`` are memory (tmpfs),
counted by its memory limit instead.

``over_limit`` decides (pure); ``DiskWatch`` measures and acts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import Counter

from controlplane.nodeagent import logkeep
from controlplane.nodeagent.periodic import Periodic

if TYPE_CHECKING:
    from controlplane.nodeagent.service import NodeAgentServicer

log = logging.getLogger(__name__)

MIB = 1 << 20
#: The least an entry counts: one block of most filesystems (an empty file
#: still takes an inode), as the log keeping counts it.
BLOCK = logkeep.BLOCK
#: The node agent's default limit (--instance-disk-mib): a runtime's caches
#: and a function's scratch files, as Cloud Run's and Lambda's defaults
#: (512 MiB-1 GiB).
DEFAULT_DISK_MIB = 1024
#: How often every instance's directory is measured (--instance-disk-check-s).
DEFAULT_CHECK_S = 2.0
#: The share of a core the walks of one instance's tree may take: a tree
#: that took w seconds to walk is walked again w / WALK_SHARE seconds later
#: at the soonest. An instance that keeps just under its limit in tiny files
#: (the default's worst case, 262,144 entries, took 1.07 s to walk,
#: 2026-11-30) then costs the agent 5% of a core, not half of one.
WALK_SHARE = 0.05

KILLS = Counter(
    "galaxy_instance_disk_kills_total",
    "Instances the node agent killed for keeping more than their resources.disk_mib "
    "(or --instance-disk-mib) in their private directory and logs",
)


def usage_of(paths: list[Path], stop_above: int) -> int:
    """Bytes paths take, each a file (the blocks it holds) or a tree
    (``usage``), stopping once past stop_above; a path gone counts 0."""
    total = 0
    for path in paths:
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            total += usage(path, stop_above - total)
        else:
            total += st.st_blocks * 512
        if total > stop_above:
            break
    return total


def usage(root: Path, stop_above: int) -> int:
    """Bytes the tree at root takes (each entry at least BLOCK), stopping
    once the count passes stop_above. A directory the walk may not read is
    opened to its owner first when this process owns it (an instance of a
    non-root agent runs as the agent's own user and may chmod its
    directories 0); 0 for a tree that is gone."""
    total = 0
    todo = [str(root)]
    while todo:
        path = todo.pop()
        try:
            entries = _listing(path)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += max(st.st_blocks * 512, BLOCK)
            if total > stop_above:
                return total
            if stat.S_ISDIR(st.st_mode):
                todo.append(entry.path)
    return total


def _listing(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except PermissionError:
        if os.lstat(path).st_uid != os.geteuid():
            raise
        os.chmod(path, stat.S_IRWXU)
        with os.scandir(path) as it:
            return list(it)


def over_limit(used: Mapping[str, int], limits: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Instances whose use passes their limit: id -> (used, limit), bytes
    (pure). An instance without a limit (0 or absent) is never over."""
    return {
        iid: (n, limits[iid]) for iid, n in used.items() if limits.get(iid, 0) and n > limits[iid]
    }


def next_walk(now: float, period_s: float, walk_s: float) -> float:
    """When a tree walked in walk_s is due again (pure)."""
    return now + max(period_s, walk_s / WALK_SHARE)


def why(used: int, limit: int) -> str:
    """The exit reason's words for an instance killed over its limit."""
    # The walk stops once past the limit: what it counted is a lower bound.
    return (
        f"out of disk: it kept {-(-used // MIB)} MiB or more in its private directory and logs, "
        f"past its limit of {limit // MIB} MiB (resources.disk_mib); the node agent killed it"
    )


@dataclass
class _Watched:
    node_id: str
    function: str
    #: its private directory, then its log files (stdout and stderr): what
    #: it writes to the node's disk, as the kubelet counts a pod's logs in
    #: its ephemeral storage
    paths: list[Path]
    limit: int


class DiskWatch(Periodic):
    """Measures every running instance's directory and logs each period_s
    and kills those over their limit (the spec's ``resources.disk_mib``, or
    default_mib; 0 = no default limit)."""

    name = "disk check"

    def __init__(
        self,
        servicer: NodeAgentServicer,
        default_mib: int,
        period_s: float = DEFAULT_CHECK_S,
        keep_logs_mib: int = logkeep.DEFAULT_KEEP_MIB,
    ) -> None:
        super().__init__()
        self.servicer = servicer
        self.default_mib = default_mib
        self.period_s = period_s
        #: ended instances' logs kept (``logkeep``), MiB
        self.keep_logs_mib = keep_logs_mib
        #: instance id -> when its tree is due again (loop time); the same
        #: for the ended instances' logs
        self._due: dict[str, float] = {}
        self._logs_due = 0.0

    def _watched(self) -> dict[str, _Watched]:
        out = {}
        for node in self.servicer.nodes.values():
            for inst in node.instances.values():
                path = getattr(inst.sandbox, "private_dir", None)
                err = getattr(inst.sandbox, "stderr_path", None)
                mib = inst.spec.resources.disk_mib or self.default_mib
                if path is not None and mib:
                    logs = [err, err.with_suffix(".out")] if err is not None else []
                    out[inst.instance_id] = _Watched(
                        node.node_id, inst.spec.name, [path, *logs], mib * MIB
                    )
            # (an instance still starting has no sandbox yet: the next check)
        return out

    def _walk(
        self, watched: dict[str, _Watched], live: set[tuple[str, str]] | None, now: float
    ) -> dict[str, int]:
        used = {}
        for iid, w in watched.items():
            t0 = time.perf_counter()
            used[iid] = usage_of(w.paths, w.limit)
            self._due[iid] = next_walk(now, self.period_s, time.perf_counter() - t0)
        log_dir = getattr(self.servicer.backend, "log_dir", None)
        if live is not None and log_dir is not None:
            t0 = time.perf_counter()
            logkeep.prune(log_dir, live, self.keep_logs_mib * MIB)
            self._logs_due = next_walk(now, self.period_s, time.perf_counter() - t0)
        return used

    async def check(self) -> list[str]:
        """One measurement of every instance due (and a pruning of ended
        instances' logs when due); returns the instances killed."""
        now = asyncio.get_running_loop().time()
        every = self._watched()
        self._due = {iid: t for iid, t in self._due.items() if iid in every}
        watched = {iid: w for iid, w in every.items() if self._due.get(iid, 0.0) <= now}
        live = None
        if self._logs_due <= now:
            # Starting instances too: their logs exist before their sandbox.
            live = {
                (logkeep.log_name(node.node_id), logkeep.log_name(iid))
                for node in self.servicer.nodes.values()
                for iid in node.instances
            }
        if not watched and live is None:
            return []
        # One thread does it all: each walk is bounded by its limit.
        used = await asyncio.to_thread(self._walk, watched, live, now)
        over = over_limit(used, {iid: w.limit for iid, w in watched.items()})
        for iid, (n, limit) in over.items():
            w = watched[iid]
            node = self.servicer.nodes.get(w.node_id)
            inst = node.instances.get(iid) if node is not None else None
            if inst is None or inst.sandbox is None:
                continue  # ended meanwhile
            log.warning(
                "instance %s of %s on node %s: %s",
                iid, w.function, w.node_id, why(n, limit),
            )  # fmt: skip
            KILLS.inc()
            inst.sandbox.kill_for(why(n, limit))
        return sorted(over)
