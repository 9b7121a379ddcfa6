"""A pool of user ids for sandboxed instances, one per running instance (as
systemd's DynamicUser gives each service its own): a kernel bug that lets one
instance out of its namespaces still meets file permissions, since no other
instance, agent or control-plane file belongs to its uid.

A uid is claimed with an exclusive ``flock`` on ``LOCK_DIR/UID`` rather than
only in memory: several node agents on one machine (``galaxy up`` runs one
per node pool) share the range, and a lock dies with the process that held
it, so a killed agent's uids come back without any sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
from pathlib import Path

# Far above login users (1000-60000), systemd's DynamicUser range
# (61184-65519) and the container ranges subuid tools hand out from 100000,
# below 2^31 (some tools still treat uids as signed).
DEFAULT_BASE = 2_100_000_000
DEFAULT_SIZE = 65_536
DEFAULT_LOCK_DIR = Path("/run/galaxy-uids")


class UidPoolExhausted(Exception):
    """Every uid of the pool is held by a running instance."""


class UidPool:
    """Hands out uids in [base, base + size), one holder at a time across
    every process on the machine that uses the same lock directory."""

    def __init__(
        self, base: int = DEFAULT_BASE, size: int = DEFAULT_SIZE, lock_dir: Path = DEFAULT_LOCK_DIR
    ) -> None:
        self.base = base
        self.size = size
        self.lock_dir = lock_dir
        # 0700: only the (root) agents see which uids are in use.
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._held: dict[int, int] = {}  # uid -> fd of its lock

    def acquire(self) -> int:
        """A uid no other instance on this machine holds."""
        # A random start: agents starting together do not all contend for
        # the same first few locks.
        start = random.randrange(self.size)
        for i in range(self.size):
            uid = self.base + (start + i) % self.size
            if uid in self._held:
                continue
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[uid] = fd
            return uid
        raise UidPoolExhausted(f"all {self.size} uids from {self.base} are in use")

    def release(self, uid: int) -> None:
        """Give uid back (after its instance's processes and files are gone)."""
        fd = self._held.pop(uid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Release every uid still held."""
        for uid in list(self._held):
            self.release(uid)
