"""The host pid of a function instance, found from outside.

An instance in the default bubblewrap sandbox has its own PID namespace: the
pid it reports (the echo example's ``"pid"``) is its pid in there, not one
the host can signal. Tests that kill or watch an instance find its host pid
here, by its ``GALAXY_INSTANCE_ID`` (which the node agent sets), skipping
the sandbox's own processes around it.
"""

from __future__ import annotations

import os

#: What runs around a function in a sandbox, with its environment.
_WRAPPERS = {b"bwrap", b"env", b"setpriv", b"sh"}


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ancestor is pid's parent, grandparent, ... (by /proc)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


def instance_pid(instance_id: str, under: int | None = None) -> int:
    """The host pid of the process running instance_id's command;
    LookupError when there is none. Instance ids repeat across control
    planes (``echo-00001-dispatch-0-0`` in each): ``under`` (a `galaxy up`'s
    pid) keeps to that control plane's processes."""
    want = f"GALAXY_INSTANCE_ID={instance_id}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if want in env and os.path.basename(argv0) not in _WRAPPERS:
            if under is None or descends_from(int(d), under):
                return int(d)
    raise LookupError(f"no process of instance {instance_id}")
