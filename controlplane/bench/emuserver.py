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

import aiohttp


def free_port() -> int:
    """A free loopback TCP port (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        end = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"emulated server exited with {self.proc.returncode}")
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)  # polling a process we do not control
        raise RuntimeError(f"emulated server not ready within {timeout_s:g}s")

    def stop(self) -> None:
        """Terminate and reap it."""
        self.proc.terminate()
        self.proc.wait(10)
