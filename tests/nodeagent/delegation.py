"""A delegated cgroup subtree for an agent that is not root, made for real
on this host's cgroup v1 hierarchies and handed to `nobody` with chown, as
an init step or systemd's Delegate= would; shared by the tests that run the
Kubernetes-shaped agent (tests/nodeagent/test_delegated_cgroups.py and
tests/security/test_escape_k8s.py)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from controlplane.nodeagent.sandbox.cgroups import ROOT

REPO = Path(__file__).resolve().parents[2]
HIERARCHIES = ("cpu", "memory", "pids")
SYSTEM_PYTHON = "/usr/bin/python3"


def unprivileged() -> pwd.struct_passwd | None:
    """The user an agent that is not root runs as here."""
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def skip_reason() -> str | None:
    """Why a delegated-subtree agent cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "making and delegating a cgroup needs root"
    if shutil.which("bwrap") is None or shutil.which("setpriv") is None:
        return "needs bubblewrap and setpriv"
    if (ROOT / "cgroup.controllers").exists():
        # v2 delegation also needs the agent itself inside the subtree (the
        # common-ancestor rule); the DaemonSet arranges that, this test not yet.
        return "cgroup v2 host: the delegated-subtree test covers the v1 layout"
    if not all((ROOT / h / "cgroup.procs").exists() for h in HIERARCHIES):
        return "no cgroup v1 cpu, memory and pids hierarchies"
    if unprivileged() is None:
        return "no user `nobody`"
    # The agent runs as nobody, who cannot reach this interpreter (under
    # /root): the system's Python of the same version loads the venv's packages.
    ver = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    if ver != str(tuple(sys.version_info[:2])):
        return f"the system's python3 is not Python {sys.version_info[:2]}"
    return None


def agent_env(home: Path) -> dict[str, str]:
    """The environment of a Python program run as nobody with the system's
    interpreter and this checkout's and the venv's packages."""
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}",
        "HOME": str(home),
        "TMPDIR": str(home),
    }


def as_nobody(user: pwd.struct_passwd) -> list[str]:
    """The command prefix that runs what follows as user."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def _rmtree_cgroup(d: Path) -> None:
    """Remove a cgroup and its children (directories only: cgroupfs files go
    with their group)."""
    if not d.is_dir():
        return
    for child in d.iterdir():
        if child.is_dir():
            _rmtree_cgroup(child)
    d.rmdir()


@dataclass
class Delegated:
    """root: the delegated root (one entry per hierarchy, each a group owned
    by the user); work: a directory of the user's; groups: the real groups."""

    root: Path
    work: Path
    groups: list[Path]


@contextlib.contextmanager
def delegated_subtree(user: pwd.struct_passwd) -> Iterator[Delegated]:
    """Make a delegated subtree and a work directory for user; remove both."""
    name = f"galaxy-delegated-{uuid.uuid4().hex[:12]}"
    root = Path(tempfile.mkdtemp(prefix="galaxy-delegated-"))
    work = Path(tempfile.mkdtemp(prefix="galaxy-delegated-work-"))
    groups = [ROOT / h / name for h in HIERARCHIES]
    try:
        os.chmod(root, 0o755)
        os.chown(work, user.pw_uid, user.pw_gid)
        for h, g in zip(HIERARCHIES, groups, strict=True):
            g.mkdir()
            # The group and what a delegate writes: its processes and children.
            for p in (g, g / "cgroup.procs", g / "tasks"):
                os.chown(p, user.pw_uid, user.pw_gid)
            (root / h).symlink_to(g)
        yield Delegated(root, work, groups)
    finally:
        for g in groups:
            with contextlib.suppress(OSError):
                _rmtree_cgroup(g)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
