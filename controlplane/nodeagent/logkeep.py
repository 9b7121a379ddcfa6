"""How much of ended instances' logs a node agent keeps
(``--instance-logs-keep-mib``): the newest, up to that many MiB in all; the
older ones are removed. A running instance's logs count in its own disk limit
(``diskwatch``); without this, an instance that writes its limit in logs,
is killed and started again would fill the node's disk one life at a time.
The kubelet keeps a container's last terminated logs the same way.

``to_remove`` decides (pure); ``prune`` reads the log directory and removes.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import Counter

#: The default of --instance-logs-keep-mib.
DEFAULT_KEEP_MIB = 1024
#: The least a file counts (an empty one still takes an inode).
BLOCK = 4096

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def log_name(name: str) -> str:
    """A node's or instance's id as a log file's or directory's name."""
    return _UNSAFE.sub("_", name)


REMOVED = Counter(
    "galaxy_instance_logs_removed_total",
    "Log files of ended instances removed past --instance-logs-keep-mib (oldest first)",
)


def to_remove(files: Iterable[tuple[str, float, int]], keep_bytes: int) -> list[str]:
    """Of (path, mtime, bytes) of ended instances' log files, those past the
    newest keep_bytes (pure). Each counts at least BLOCK."""
    out, total = [], 0
    for path, _, size in sorted(files, key=lambda f: f[1], reverse=True):
        total += max(size, BLOCK)
        if total > keep_bytes:
            out.append(path)
    return out


def prune(log_dir: Path, live: set[tuple[str, str]], keep_bytes: int) -> int:
    """Remove the log files under log_dir (``NODE/INSTANCE.out|err``) of
    instances that ended, oldest first, past keep_bytes; live: the
    (``log_name(node)``, ``log_name(instance)``) of instances starting or
    running (never removed nor counted). Returns how many went."""
    files = []
    with contextlib.suppress(OSError), os.scandir(log_dir) as nodes:
        for node in nodes:
            if not node.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError), os.scandir(node.path) as it:
                for f in it:
                    stem, dot, ext = f.name.rpartition(".")
                    if not dot or ext not in ("out", "err") or (node.name, stem) in live:
                        continue
                    with contextlib.suppress(OSError):
                        st = f.stat(follow_symlinks=False)
                        files.append((f.path, st.st_mtime, st.st_blocks * 512))
    gone = 0
    for path in to_remove(files, keep_bytes):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            gone += 1
    REMOVED.inc(gone)
    return gone
