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


async def terminate(proc: Spawned, grace_s: float) -> None:
    """SIGTERM the child, SIGKILL it after grace_s; returns once it is gone."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
