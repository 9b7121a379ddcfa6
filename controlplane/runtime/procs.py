"""Child process helpers shared by the node agent's sandboxes, the local
actuator and the launchers (``galaxy up``, etcd, Prometheus, benches).

Every child is started by CPython's ``subprocess.Popen``, never by the event
loop's subprocess support: under uvloop that forks through libuv and runs
Python and gRPC's fork handlers in the child before exec, which in a process
with gRPC threads aborts now and then (seen: the child dying with SIGABRT on
gRPC's ``Check failed: next_worker->state == KICKED``, or SIGSEGV in
``threading._after_fork``, before it could exec etcd). Popen forks (vfork)
and execs in C and blocks only for that (about a millisecond).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import IO, Any


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Await a child's exit without a thread: its pidfd turns readable when
    it exits; then reaping it cannot block."""
    return await _wait_pidfd(proc, os.pidfd_open(proc.pid))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spawned:
    """A child started by :func:`spawn`, with the part of
    ``asyncio.subprocess.Process`` its users need: ``pid``, ``returncode``
    (set once the exit is seen), ``await wait()``, signals, ``stdout`` as a
    StreamReader when piped, and ``stdin`` as the unbuffered pipe file when
    piped (writes are small: lifelines and one-line handshakes)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader | None):
        self.popen = popen
        self.pid = popen.pid
        self.stdin = popen.stdin
        self.stdout = stdout
        # Opened now, before anything can reap the child (a pidfd of a reaped
        # pid cannot be had).
        self._exit = asyncio.ensure_future(_wait_pidfd(popen, os.pidfd_open(popen.pid)))

    @property
    def returncode(self) -> int | None:
        """The exit code once the exit was seen (negative: the signal)."""
        return self.popen.returncode

    async def wait(self) -> int:
        """Await the exit; returns the exit code."""
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        """Send sig unless the child is known to have exited."""
        if self.popen.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


async def spawn(
    *argv: str,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    start_new_session: bool = False,
) -> Spawned:
    """Start argv as ``asyncio.create_subprocess_exec`` would (the same
    ``PIPE``/``DEVNULL``/file arguments), by ``subprocess.Popen`` (see the
    module's docstring for why). Raises OSError when argv cannot be run."""
    popen = subprocess.Popen(  # noqa: ASYNC220 - fork+exec in C, ~1 ms
        argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
        bufsize=0, start_new_session=start_new_session,
    )  # fmt: skip
    reader = None
    if popen.stdout is not None:
        reader = asyncio.StreamReader(limit=2**20)
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), popen.stdout
        )
    return Spawned(popen, reader)


async def _wait_pidfd(proc: subprocess.Popen[bytes], fd: int) -> int:
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        loop.remove_reader(fd)
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


#: After a child that had to be killed is gone: how long its descendants
#: get to die by their parent-death signal before they are killed too.
TREE_GRACE_S = 2.0


async def terminate(proc: Spawned, grace_s: float, tree_grace_s: float = TREE_GRACE_S) -> None:
    """SIGTERM the child, SIGKILL it after grace_s; returns once it and what
    it started are gone.

    A node agent stops its instances before it exits; one killed past its
    grace leaves them to their parent-death signal, which the kernel
    delivers a moment after. Either way the child's descendants are watched
    from before the signals (by pidfd, so a reused pid is never touched),
    given tree_grace_s once the child is gone, then killed."""
    if proc.returncode is not None:
        return
    below = pidfds(descendants(proc.pid))
    try:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            below += pidfds(descendants(proc.pid))  # started since: watched twice, harmless
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        await reap_tree(below, tree_grace_s)
    finally:
        for fd in below:
            os.close(fd)


def descendants(pid: int) -> list[int]:
    """The pids below pid (children, theirs, ...), read from /proc; those
    that are gone, or are another user's, are skipped."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError, ValueError):
                    with open(f"/proc/{p}/task/{tid}/children") as f:
                        kids = [int(k) for k in f.read().split()]
                    out += kids
                    todo += kids
    return out


def pidfds(pids: list[int]) -> list[int]:
    """A pidfd for each pid still there (the gone are skipped)."""
    fds: list[int] = []
    for pid in pids:
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(pid))
    return fds


async def reap_tree(fds: list[int], grace_s: float) -> None:
    """Wait up to grace_s for the processes of fds to exit, SIGKILL the rest
    and wait for them (up to grace_s again). The caller closes fds."""
    if not await _all_exited(fds, grace_s):
        for fd in fds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        await _all_exited(fds, grace_s)


async def _all_exited(fds: list[int], within_s: float) -> bool:
    loop = asyncio.get_running_loop()
    pending = set(fds)
    done = asyncio.Event()

    def exited(fd: int) -> None:
        loop.remove_reader(fd)
        pending.discard(fd)
        if not pending:
            done.set()

    for fd in fds:
        loop.add_reader(fd, exited, fd)
    if not pending:
        done.set()
    try:
        await asyncio.wait_for(done.wait(), within_s)
        return True
    except TimeoutError:
        return False
    finally:
        for fd in pending:
            loop.remove_reader(fd)
