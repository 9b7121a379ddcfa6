"""Where `galaxy up`'s node agents keep their model caches: the disk tier in
RUN_DIR/models/AGENT (kept across runs), the memory tier on /dev/shm in a
directory per run dir (removed when the control plane stops; one left by a
supervisor that was killed is removed by the next `galaxy up` on the host)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from controlplane.launch.upconfig import UpConfig


def shm_dir(run_dir: Path) -> Path | None:
    """This run dir's directory on tmpfs, when the host has /dev/shm."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return None
    tag = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return shm / f"galaxy-models-{tag}"


#: The file in a memory-tier directory naming the supervisor that owns it.
OWNER = "owner"


def _process_start(pid: int) -> str | None:
    """The start time of process pid (field 22 of /proc/PID/stat), which
    with the pid names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after it.
    return stat.rsplit(")", 1)[-1].split()[19]


def claim(run_dir: Path) -> None:
    """Make this process the owner of run_dir's memory-tier directory, and
    remove the directories of owners that died without cleaning up (a
    SIGKILLed `galaxy up`): tmpfs is RAM, and nothing else would free it."""
    memory = shm_dir(run_dir)
    if memory is None:
        return
    for other in memory.parent.glob("galaxy-models-*"):
        if other != memory and _dead_owner(other):
            shutil.rmtree(other, ignore_errors=True)
    memory.mkdir(exist_ok=True)
    (memory / OWNER).write_text(f"{os.getpid()} {_process_start(os.getpid())}\n")


def _dead_owner(directory: Path) -> bool:
    """True if directory's owner file names a process that is gone. A
    directory without one (being created, or made by an older version) is
    left alone: its owner cannot be told."""
    try:
        pid_text, start = (directory / OWNER).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    return _process_start(pid) != start


def model_cache_settings(cfg: UpConfig, agent: str) -> dict[str, Any]:
    """NodeAgentConfig fields of a real-process agent's model cache (none
    for emulated sandboxes, which start no process)."""
    if cfg.sandbox == "emulated":
        return {}
    out: dict[str, Any] = {"model_cache_dir": str(cfg.run_dir / "models" / agent)}
    memory = shm_dir(cfg.run_dir)
    if memory is not None:
        out["model_cache_memory_dir"] = str(memory / agent)
    return out
