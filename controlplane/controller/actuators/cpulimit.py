"""CPU limits for local instances, as a Kubernetes pod's ``limits.cpu``.

In a real deployment every control function instance is a pod with its own
CPU limit, so one instance's throughput (T) is bounded by that limit and
adding instances adds capacity. On one machine all processes share its
cores; ``--control-cpu-limit`` restores the deployment's shape by putting
each control function process into its own cgroup with a CFS quota (cgroup
v1 ``cpu`` or cgroup v2 ``cpu.max``; needs permission to create cgroups,
e.g. root).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# A short CFS period keeps a throttled process responsive (it runs a little
# every 10 ms instead of a long stretch every 100 ms).
PERIOD_US = 10_000
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")


KINDS = ("dispatch", "schedule", "clustermgr")


class CpuLimitError(Exception):
    """The CPU limit could not be applied; the message says why."""


def parse_limits(values: list[str]) -> dict[str, float]:
    """``["0.5", "schedule=0.25"]`` -> CPUs per kind (a bare number sets
    every kind; KIND=CPUS then overrides one). Raises ValueError."""
    out: dict[str, float] = {}
    for v in values:
        kind, sep, cpus = v.rpartition("=")
        if sep and kind not in KINDS:
            raise ValueError(f"CPU limit {v!r}: kind must be one of {', '.join(KINDS)}")
        n = float(cpus)
        if n <= 0:
            raise ValueError(f"CPU limit {v!r} must be > 0")
        for k in [kind] if sep else KINDS:
            out[k] = n
    return out


def _base() -> tuple[Path, int]:
    if (_V2 / "cgroup.controllers").exists():
        if "cpu" not in (_V2 / "cgroup.controllers").read_text().split():
            raise CpuLimitError("cgroup v2 without the cpu controller")
        return _V2, 2
    if (_V1 / "cpu.cfs_quota_us").exists():
        return _V1, 1
    raise CpuLimitError("no cgroup cpu controller found under /sys/fs/cgroup")


def limit_process(pid: int, cores: float, name: str) -> Path:
    """Limit process pid (and its future children) to ``cores`` CPUs.

    Returns the cgroup directory; pass it to ``release`` once the process
    has exited. The group is galaxy-<this pid>/<name>, so concurrent runs do
    not collide.
    """
    if cores <= 0:
        raise CpuLimitError(f"CPU limit must be > 0, got {cores}")
    base, version = _base()
    parent = base / f"galaxy-{os.getpid()}"
    group = parent / name
    quota = max(1000, int(cores * PERIOD_US))
    try:
        group.mkdir(parents=True, exist_ok=True)
        if version == 1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            for d in (base, parent):
                with contextlib.suppress(OSError):
                    (d / "cgroup.subtree_control").write_text("+cpu")
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        raise CpuLimitError(f"cannot limit process {pid} to {cores} CPU in {group}: {e}") from e
    return group


def release(group: Path) -> None:
    """Remove a group made by ``limit_process`` (and its parent when empty)."""
    for d in (group, group.parent):
        with contextlib.suppress(OSError):
            d.rmdir()
