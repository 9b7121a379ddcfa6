"""Child process helpers shared by the node agent's sandboxes and the local
actuator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Await a child's exit without a thread: its pidfd turns readable when
    it exits; then reaping it cannot block."""
    loop = asyncio.get_running_loop()
    fd = os.pidfd_open(proc.pid)
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


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
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
