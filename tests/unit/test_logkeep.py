"""Ended instances' logs: the newest kept up to --instance-logs-keep-mib,
the older removed; a starting or running instance's never touched."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.nodeagent import logkeep
from controlplane.nodeagent.logkeep import BLOCK, log_name, prune, to_remove

MIB = 1 << 20


def test_the_newest_are_kept_up_to_the_bound() -> None:
    files = [("old", 1.0, MIB), ("mid", 2.0, MIB), ("new", 3.0, MIB)]
    assert to_remove(files, 2 * MIB) == ["old"]
    assert to_remove(files, 0) == ["new", "mid", "old"]
    # An empty file still counts a block (a million of them take inodes).
    assert to_remove([("e1", 1.0, 0), ("e2", 2.0, 0)], BLOCK) == ["e1"]


def _log(root: Path, node: str, instance: str, ext: str, size: int, mtime: float) -> Path:
    d = root / log_name(node)
    d.mkdir(exist_ok=True)
    p = d / f"{log_name(instance)}.{ext}"
    p.write_bytes(os.urandom(size))
    os.utime(p, (mtime, mtime))
    return p


def test_prune_removes_the_oldest_ended_and_never_a_live_one(tmp_path: Path) -> None:
    old = _log(tmp_path, "node-0", "f-1", "err", MIB, 100.0)
    new = _log(tmp_path, "node-0", "f-2", "out", MIB, 200.0)
    # Older than both, but its instance runs (or is starting): not counted.
    live = _log(tmp_path, "node-0", "f/3", "out", 2 * MIB, 50.0)
    other = tmp_path / "node-0" / "notes.txt"  # not an instance's log
    other.write_text("x")
    before = logkeep.REMOVED._value.get()
    assert prune(tmp_path, {(log_name("node-0"), log_name("f/3"))}, MIB + BLOCK) == 1
    assert not old.exists() and new.exists() and live.exists() and other.exists()
    assert logkeep.REMOVED._value.get() == before + 1
    assert prune(tmp_path / "gone", set(), 0) == 0
