"""How a process-sandbox instance is launched: the command prefixes that
give it the parent-death signal and, with ``--instance-user``, another
user; and the check that its command can run at all."""

from __future__ import annotations

import os
import pwd
import shutil
import sys

from controlplane.runtime.validation import short

# Run by the fallback launcher (no setpriv): set the parent-death signal, check
# the agent did not die before that (the signal would then never come), exec.
_PY_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


#: Run by /bin/sh once setpriv has set the parent-death signal: exit (125,
#: before the instance's command runs) if the agent ($0) was gone before
#: that, since the signal would then never come. Without it an agent killed
#: between its fork and setpriv's prctl left an instance running for good
#: (seen: an echo instance outliving a chaos test's kill -9 of its agent).
_ORPHAN_CHECK = '[ "$PPID" = "$0" ] || exit 125; exec "$@"'


def orphan_check(agent_pid: int) -> list[str]:
    """The command prefix that runs the rest only while agent_pid is this
    process's parent (run after the parent-death signal is set)."""
    return ["/bin/sh", "-c", _ORPHAN_CHECK, str(agent_pid)]


def pdeathsig_prefix() -> list[str]:
    """Command prefix that gives an instance SIGKILL when its agent dies.

    PR_SET_PDEATHSIG survives exec, so a launcher can set it and then exec the
    instance's command in the same process: instances never outlive their
    node agent, even one killed with SIGKILL (one killed before the signal
    was set is caught by ``orphan_check``). The setting is not made in a
    preexec_fn: running Python in the child of a forked multi-threaded process
    (gRPC and asyncio threads) crashes intermittently (seen here as SIGSEGV in
    threading._after_fork). util-linux ``setpriv`` costs ~1 ms; without it a
    Python launcher is used (slower: one interpreter start).
    """
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "KILL", "--", *orphan_check(os.getpid())]
    return [sys.executable, "-S", "-I", "-c", _PY_LAUNCHER, str(os.getpid())]


def instance_user(user: str) -> pwd.struct_passwd:
    """The account of --instance-user (name or uid); ValueError if unknown."""
    try:
        return pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"--instance-user: no user {short(user)} on this node") from None


def run_as_prefix(user: str) -> list[str]:
    """Command prefix that runs an instance as user (name or uid) with no
    supplementary groups and the parent-death signal, via util-linux
    setpriv. ValueError (naming --instance-user) when that cannot work: an
    unknown user, no setpriv, or an agent without the right to switch."""
    pw = instance_user(user)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise ValueError("--instance-user needs util-linux `setpriv` on the node")
    if os.geteuid() != 0 and pw.pw_uid != os.geteuid():
        raise ValueError("--instance-user: the node agent must run as root to switch users")
    return [
        setpriv, f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
        "--pdeathsig", "KILL", "--", *orphan_check(os.getpid()),
    ]  # fmt: skip


def resolve(command: str, path: str) -> str:
    """command's absolute path on path (a PATH string), skipping version
    managers' shims (pyenv, rbenv, asdf put scripts in a ``shims``
    directory). A shim picks the real interpreter from the caller's home,
    environment and working directory: a sandbox does not show the home, and
    an instance's working directory is its own, so through a shim the same
    runtime could run another interpreter per sandbox kind, or per workdir.
    Every backend runs the next match (the interpreter itself) instead.
    command itself when nothing is found (the start then fails naming it)."""
    if "/" in command:
        return command
    for entry in path.split(os.pathsep):
        if not entry or os.path.basename(os.path.normpath(entry)) == "shims":
            continue
        found = shutil.which(command, path=entry)
        if found is not None:
            return os.path.abspath(found)
    return command


def cannot_run(command: str, env: dict[str, str], cwd: str | None) -> str | None:
    """Why command cannot be run (None when it can).

    Checked up front because through the launcher a missing binary would only
    show as an early exit. Synchronous: a few stat calls.
    """
    if cwd is not None and not os.path.isdir(cwd):
        return f"workdir {cwd} does not exist on this node"
    if "/" in command:
        path = os.path.join(cwd or os.getcwd(), command)
        ok = os.path.isfile(path) and os.access(path, os.X_OK)
    else:
        ok = shutil.which(command, path=env.get("PATH")) is not None
    return None if ok else f"{short(command)} is not found or not executable on this node"
