"""Private working directories: each process-sandbox instance gets its own
directory, its cwd when the spec names no ``workdir`` and its ``HOME`` and
``TMPDIR`` in every case, so instances on one node do not share scratch space
(``/tmp``) or read each other's files.

Layout: ``ROOT/AGENT_PID.N/INSTANCE`` (``ROOT`` is ``--instance-dir``, default
``$TMPDIR/galaxy-instances-UID``; ``N`` tells apart backends in one process, as
in tests). ``ROOT`` and ``ROOT/AGENT_PID.N`` are mode 0711:
an instance running as ``--instance-user`` can reach its own directory but
cannot list which others exist; each instance directory is mode 0700 and
owned by the instance's user. A directory goes when its instance ends; the
directories of agents that are gone (killed before they could clean up) are
swept when the next agent starts, like their cgroups.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.runtime.procs import pid_alive

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_serial = itertools.count()


def default_root() -> Path:
    """``$TMPDIR/galaxy-instances-UID``: fixed (not a fresh temp dir) so a
    later agent finds and sweeps what a killed one left; per user, because
    the directory must belong to the agent's user (``_make_private``)."""
    return Path(tempfile.gettempdir()) / f"galaxy-instances-{os.geteuid()}"


def _make_private(path: Path, mode: int) -> None:
    """mkdir path (or accept it) only if it is a real directory of ours:
    refusing a symlink or another user's directory keeps a local user from
    planting one in a shared /tmp and reading instances' files."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{path} is not a directory owned by the node agent's user")
    os.chmod(path, mode)  # mkdir's mode is masked by the umask


def rmtree(path: Path) -> None:
    """Remove path and everything in it, also directories an instance made
    read-only (a same-user agent could not delete their entries otherwise)."""

    def retry(func: Callable[..., Any], p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, ignore_errors=True)
            else:
                func(p)

    shutil.rmtree(path, onerror=retry)


class InstanceDirs:
    """Creates and removes the private directories of one agent's instances.

    owner: (uid, gid) the directories are given to (``--instance-user``);
    None: the agent's own user.
    """

    def __init__(self, root: Path | None = None, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.owner = owner
        self.root.mkdir(parents=True, exist_ok=True)
        _make_private(self.root, 0o711)
        self._sweep_stale()
        #: This backend's directory, made with its first instance's.
        self.base = self.root / f"{os.getpid()}.{next(_serial)}"

    def create(self, instance_id: str, owner: tuple[int, int] | None = None) -> Path:
        """A new empty directory for instance_id, mode 0700, owned by owner
        (default: the owner given to the constructor)."""
        owner = owner or self.owner
        _make_private(self.base, 0o711)
        path = self.base / _SAFE.sub("_", instance_id)
        if path.exists():  # an instance id is used once; a leftover is stale
            rmtree(path)
        path.mkdir(mode=0o700)
        if owner is not None:
            os.chown(path, *owner)
        os.chmod(path, 0o700)
        return path

    def remove(self, path: Path) -> None:
        """Delete an instance's directory (blocking: run it in a thread)."""
        with contextlib.suppress(FileNotFoundError):
            rmtree(path)

    def close(self) -> None:
        """Remove this agent's directory and what is left in it."""
        with contextlib.suppress(FileNotFoundError):
            rmtree(self.base)

    def _sweep_stale(self) -> None:
        with contextlib.suppress(OSError):
            for agent in self.root.iterdir():
                pid = agent.name.split(".")[0]
                if not pid.isdigit() or pid_alive(int(pid)) or int(pid) == os.getpid():
                    continue
                if agent.is_symlink() or not agent.is_dir():
                    continue
                rmtree(agent)
                log.info("removed the instance directories of agent %s, which is gone", pid)
