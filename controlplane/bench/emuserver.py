"""Emulated LLM server subprocesses for the LLM cross-checks (the guidellm
check and the router comparison): each on a free loopback port, waited for
by its /health, stopped by pid."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp


def free_port() -> int:
    """A free loopback TCP port (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ok(url: str, exited: Callable[[], int | None], what: str, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; RuntimeError naming ``what`` if its
    process exits (``exited()`` gives its code) or ``timeout_s`` passes."""
    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            code = exited()
            if code is not None:
                raise RuntimeError(f"{what} exited with {code}")
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)  # polling a process we do not control
    raise RuntimeError(f"{what} at {url} not ready within {timeout_s:g}s")


class EmulatedServer:
    """A fresh emulated LLM server subprocess on a free loopback port."""

    def __init__(self, profile: str, model: str = "emu") -> None:
        self.port = free_port()
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port)}
        cmd = [sys.executable, "-m", "controlplane.llm.server", "--profile", profile,
               "--model", model]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until /health answers (the process's own readiness)."""
        await wait_ok(self.url + "/health", lambda: self.proc.poll(), "emulated server",
                      timeout_s)  # fmt: skip

    def stop(self) -> None:
        """Terminate and reap it."""
        self.proc.terminate()
        self.proc.wait(10)
