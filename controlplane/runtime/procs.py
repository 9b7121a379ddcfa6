"""Child process helpers shared by the node agent's sandboxes and the local
actuator."""

from __future__ import annotations

import asyncio
import os
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
