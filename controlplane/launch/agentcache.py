"""Where `galaxy up`'s node agents keep their model caches: the disk tier in
RUN_DIR/models/AGENT (kept across runs), the memory tier on /dev/shm in a
directory per run dir (removed when the control plane stops)."""

from __future__ import annotations

import hashlib
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
