"""A throwaway single-member etcd on loopback for ``state: etcd`` plans.

Each control plane configuration gets a fresh data directory, so plans do
not see each other's records. Needs the ``etcd`` binary (Debian package
``etcd-server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import urllib.request
from pathlib import Path

from controlplane.runtime import procs

_START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
            return b"true" in r.read()
    except OSError:
        return False


class LocalEtcd:
    """``etcd`` as a child process; ``url`` is the ``etcd://`` state URL."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: procs.Spawned | None = None
        self.client_port = 0

    @property
    def url(self) -> str:
        """State store URL for ``galaxy up --state``."""
        return f"etcd://127.0.0.1:{self.client_port}"

    async def start(self) -> str:
        """Start etcd and wait until it is healthy; returns the state URL."""
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("state: etcd needs the etcd binary (apt-get install etcd-server)")
        self.client_port, peer = _free_port(), _free_port()
        client = f"http://127.0.0.1:{self.client_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir.parent / f"{self.data_dir.name}.log").open("ab")
        with log:
            self.proc = await procs.spawn(
                binary,
                "--name=bench",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=bench={peer_url}",
                stdout=log,
                stderr=log,
            )
        loop = asyncio.get_running_loop()
        end = loop.time() + _START_TIMEOUT_S
        while not await asyncio.to_thread(_healthy, client):
            if self.proc.returncode is not None or loop.time() > end:
                await self.stop()
                raise RuntimeError(f"etcd did not become healthy; see {log.name}")
            await asyncio.sleep(0.1)  # etcd starts in well under a second
        return self.url

    async def stop(self) -> None:
        """Stop etcd and delete its data."""
        p, self.proc = self.proc, None
        if p is not None and p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
