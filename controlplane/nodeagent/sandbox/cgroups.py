"""Per-instance cgroups: a function instance gets the CPU and memory its spec
reserves as hard limits, not just as bookkeeping, and a cap on its number of
processes and threads (``pids.max``), so a fork loop fails in the instance
instead of exhausting the node's process table.

Each instance runs in its own group under ``galaxy/AGENT_PID/`` with a
memory limit of ``resources.memory_mib`` from the start (no swap where the
kernel allows it) and, once it is ready, a CFS quota of
``resources.cpu_millis`` (start-up runs unthrottled: see ``limit_cpu``). cgroup v2
(``cpu.max``, ``memory.max``, ``memory.events``, ``pids.max``) and v1 (the
``cpu``, ``memory`` and ``pids`` hierarchies) are both supported. The process joins its groups
before it execs the function's command (``launcher``), so no code of the
function ever runs unlimited. A kill by the OOM killer is read back from
the group's counters, so the exit can be reported as what it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from controlplane.runtime.procs import pid_alive

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
#: CFS period: short, so a throttled instance runs a little every 10 ms.
PERIOD_US = 10_000
#: Default ``--instance-max-pids``. Threads count too (the kernel's pids
#: controller counts tasks), so this leaves room for a thread pool per core on
#: a large node while a fork loop still stops long before the node's pid_max.
DEFAULT_MAX_PIDS = 1024
# Joins every group named in $0 (colon-separated), then execs the command.
_JOIN = 'IFS=:; for f in $0; do echo $$ > "$f" || exit 126; done; exec "$@"'
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class CgroupError(Exception):
    """cgroups are unavailable or not writable; the message says why."""


class PidsUnavailable(CgroupError):
    """cpu and memory can be limited but the pids controller is missing."""


@dataclass
class InstanceGroup:
    """The groups of one instance (one per hierarchy; one on v2)."""

    dirs: list[Path]
    memory_dir: Path | None
    version: int
    #: The group holding ``pids.max`` (None: no pids limit).
    pids_dir: Path | None = None

    def launcher(self) -> list[str]:
        """Command prefix that joins the groups and execs the rest."""
        procs = ":".join(str(d / "cgroup.procs") for d in self.dirs)
        return ["/bin/sh", "-c", _JOIN, procs]

    def limit_cpu(self, cpu_millis: int) -> None:
        """Apply the CPU quota (0: none). Called once the instance is ready:
        start-up runs unthrottled (a Python server needs ~80 ms of CPU to
        start; at 250 millicores that took 4.5x as long, measured by
        controlplane/bench/security.py), the steady state is limited."""
        if not cpu_millis:
            return
        quota = max(1000, cpu_millis * PERIOD_US // 1000)
        try:
            if self.version == 2:
                (self.dirs[0] / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as e:
            raise CgroupError(f"cannot set the CPU quota: {e.strerror}") from None

    def oom_kills(self) -> int:
        """Processes of this instance the OOM killer killed (0 if unknown)."""
        if self.memory_dir is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.memory_dir / name).read_text()
        except OSError:
            return 0
        m = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(m.group(1)) if m else 0

    def pids_limit_hits(self) -> int:
        """Forks and clones the pids limit refused (0 if unknown or none)."""
        if self.pids_dir is None:
            return 0
        try:
            text = (self.pids_dir / "pids.events").read_text()
        except OSError:
            return 0
        m = re.search(r"^max (\d+)$", text, re.MULTILINE)
        return int(m.group(1)) if m else 0

    def procs(self) -> list[int]:
        """Processes still in the group (empty when unknown)."""
        try:
            return [int(x) for x in (self.dirs[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    async def empty(self, within_s: float = 2.0) -> None:
        """SIGKILL what is left in the group, also processes that left the
        instance's process group (setsid), so the group can be removed.
        Polls: a v1 group gives no event when it becomes empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while (pids := self.procs()) and loop.time() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)

    def remove(self) -> None:
        """Delete the groups (their processes have exited)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()


class Cgroups:
    """Creates instance groups under ``galaxy/AGENT_PID`` (v2 or v1).

    max_pids: each instance's ``pids.max`` (0: no limit, and the pids
    controller is not needed). PidsUnavailable when it is set and the
    controller is missing (``open_cgroups`` decides whether that is fatal).
    """

    def __init__(self, root: Path = ROOT, max_pids: int = 0) -> None:
        if max_pids < 0:
            raise ValueError("max_pids must be >= 0")
        self.root = root
        self.max_pids = max_pids
        parent = Path("galaxy") / str(os.getpid())
        controllers = "+cpu +memory"
        if (root / "cgroup.controllers").exists():
            have = (root / "cgroup.controllers").read_text().split()
            missing = {"cpu", "memory"} - set(have)
            if missing:
                raise CgroupError(f"cgroup v2 without the {', '.join(sorted(missing))} controller")
            if max_pids and "pids" not in have:
                raise PidsUnavailable("cgroup v2 without the pids controller")
            if max_pids:
                controllers += " +pids"
            self.version = 2
            self.parents = [root / parent]
        elif (root / "cpu" / "cpu.cfs_quota_us").exists() and (root / "memory").is_dir():
            self.version = 1
            self.parents = [root / "cpu" / parent, root / "memory" / parent]
            if max_pids:
                if not (root / "pids" / "cgroup.procs").exists():
                    raise PidsUnavailable(f"no cgroup v1 pids hierarchy under {root}")
                self.parents.append(root / "pids" / parent)
        else:
            raise CgroupError(f"no cgroup cpu and memory controllers under {root}")
        for p in self.parents:
            _sweep_stale(p.parent)
        try:
            for p in self.parents:
                p.mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                # Children may only use the controllers their parents enable.
                for d in (root / "galaxy", root / parent):
                    _enable(d.parent, controllers, root)
        except OSError as e:
            raise CgroupError(f"cannot create cgroups under {root}: {e.strerror}") from None

    def create(self, instance_id: str, memory_mib: int) -> InstanceGroup:
        """A group limited to memory_mib (0 = no limit) and ``max_pids``
        tasks; its CPU quota comes later (``InstanceGroup.limit_cpu``)."""
        name = _SAFE.sub("_", instance_id)
        dirs = [p / name for p in self.parents]
        try:
            for d in dirs:
                d.mkdir(exist_ok=True)
            if self.version == 2:
                d = dirs[0]
                (d / "cpu.max").write_text(f"max {PERIOD_US}")
                if memory_mib:
                    (d / "memory.max").write_text(str(memory_mib << 20))
                    with contextlib.suppress(OSError):
                        (d / "memory.swap.max").write_text("0")
                pids = d if self.max_pids else None
            else:
                cpu, mem = dirs[:2]
                (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                if memory_mib:
                    (mem / "memory.limit_in_bytes").write_text(str(memory_mib << 20))
                    with contextlib.suppress(OSError):  # only with swap accounting
                        (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_mib << 20))
                d = mem
                pids = dirs[2] if self.max_pids else None
            if pids is not None:
                (pids / "pids.max").write_text(str(self.max_pids))
            return InstanceGroup(dirs, d, self.version, pids)
        except OSError as e:
            InstanceGroup(dirs, None, self.version).remove()
            raise CgroupError(f"cannot set up the cgroup of {instance_id}: {e.strerror}") from None

    def close(self) -> None:
        """Remove the agent's parent groups (empty once instances are gone)."""
        for p in self.parents:
            with contextlib.suppress(OSError):
                for child in p.iterdir():
                    if child.is_dir():
                        child.rmdir()
                p.rmdir()
            with contextlib.suppress(OSError):
                p.parent.rmdir()  # galaxy/: only when no other agent uses it


def _enable(group: Path, controllers: str, root: Path) -> None:
    """Enable controllers for group's children (v2). A group that holds
    processes cannot (the "no internal processes" rule: EBUSY), which is
    where an agent in a container with a cgroup namespace stands: its
    container's group is its ``/sys/fs/cgroup`` and it is in it. The agent
    then moves itself into a leaf of its own, ``ROOT/agent``, first."""
    try:
        (group / "cgroup.subtree_control").write_text(controllers)
        return
    except OSError as e:
        if e.errno != errno.EBUSY or group != root:
            raise
    leaf = root / "agent"
    leaf.mkdir(exist_ok=True)
    (leaf / "cgroup.procs").write_text(str(os.getpid()))
    try:
        (group / "cgroup.subtree_control").write_text(controllers)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise CgroupError(
                f"{root} holds other processes besides this agent, so its children "
                "cannot get controllers; give the agent a cgroup subtree of its own"
            ) from None
        raise


def _sweep_stale(galaxy_dir: Path) -> None:
    """Remove the groups of agents that are gone (killed before they could
    clean up): ``galaxy/PID`` whose PID no longer runs. A process still in
    one outlived its agent, which no instance may (its parent-death signal
    missed it): it is killed, by the pids its group lists, and the group
    goes once empty (at this sweep or the next agent's)."""
    with contextlib.suppress(OSError):
        for agent in galaxy_dir.iterdir():
            if not agent.is_dir() or not agent.name.isdigit() or pid_alive(int(agent.name)):
                continue
            with contextlib.suppress(OSError):
                for child in agent.iterdir():
                    if child.is_dir():
                        _kill_members(child, agent.name)
                        child.rmdir()  # fails (and stays) while a process is in it
                agent.rmdir()
                log.info("removed the cgroup of agent %s, which is gone", agent.name)


def _kill_members(group: Path, agent: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        pids = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if pids:
            log.warning(
                "killed %d processes of instance %s, left by agent %s, which is gone",
                len(pids), group.name, agent,
            )  # fmt: skip


def open_cgroups(mode: str, max_pids: int = 0, root: Path = ROOT) -> Cgroups | None:
    """mode "on": cgroups (with the pids limit when max_pids > 0) or
    CgroupError; "auto": cgroups when they can be made, without the pids
    limit when only that controller is missing (each logged once); "off":
    None."""
    if mode == "off":
        return None
    try:
        return Cgroups(root, max_pids=max_pids)
    except PidsUnavailable as e:
        if mode == "on":
            raise
        log.warning("instances run without a pids limit (--instance-max-pids): %s", e)
        try:
            return Cgroups(root)
        except CgroupError as e2:
            log.warning("instances run without CPU/memory limits: %s", e2)
            return None
    except CgroupError as e:
        if mode == "on":
            raise
        log.warning("instances run without CPU/memory limits: %s", e)
        return None
