"""A local single-member etcd for `galaxy up --ha` and `galaxy chaos`.

``LocalEtcd`` runs the ``etcd`` binary on loopback ports chosen once, so it
can be stopped and started again on the same data directory and address
(clients keep their URL). It dies with its parent (``setpriv --pdeathsig``),
so nothing outlives a supervisor killed with SIGKILL.

``python -m controlplane.launch.etcd`` runs one as a `galaxy up` child: it
prints the ready line the supervisor waits for once etcd is healthy, exits
when etcd does (the supervisor restarts it on the same ports and data) and
stops etcd on SIGTERM or when its lifeline (stdin) closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from controlplane.runtime import procs
from controlplane.runtime.host import READY_PREFIX, watch_lifeline

ETCD_ENV = "GALAXY_ETCD_BINARY"
START_TIMEOUT_S = 30.0


def etcd_binary() -> str | None:
    """The etcd binary ($GALAXY_ETCD_BINARY, else etcd on PATH), or None."""
    env = os.environ.get(ETCD_ENV)
    if env and os.access(env, os.X_OK):
        return env
    return shutil.which("etcd")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on host (released before etcd binds it: a collision
    is unlikely on loopback, and start() reports it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class LocalEtcd:
    """One etcd process: start, stop, start again on the same ports and data."""

    def __init__(
        self,
        data_dir: Path,
        *,
        client_port: int = 0,
        peer_port: int = 0,
        host: str = "127.0.0.1",
        binary: str | None = None,
    ) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise RuntimeError(f"no etcd binary found (install etcd-server or set ${ETCD_ENV})")
        self.binary = found
        self.data_dir = data_dir
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.proc: procs.Spawned | None = None

    @property
    def address(self) -> str:
        """host:port of the client listener."""
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        """The ``--state`` URL of this etcd."""
        return f"etcd://{self.address}"

    @property
    def pid(self) -> int | None:
        """The etcd process id while it runs."""
        proc = self.proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc is not None and self.proc.returncode is None

    def command(self) -> list[str]:
        """etcd's command line (behind setpriv: it dies with its parent)."""
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        return [
            *prefix, self.binary, "--name", "galaxy", "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"galaxy={peer}", "--initial-cluster-state", "new",
            # Short raft timers: one member elects itself quickly after a restart.
            "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn",
        ]  # fmt: skip

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start etcd and wait until it reports healthy (RuntimeError naming
        the log if it exits or is not healthy in time)."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Opening a local log file does not block the loop in any way that matters.
        with open(self.log_path, "ab") as logf:  # noqa: ASYNC230
            self.proc = await procs.spawn(
                *self.command(),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
            )
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not await self.healthy():
            if self.proc.returncode is not None:
                raise RuntimeError(
                    f"etcd exited with code {self.proc.returncode}; see {self.log_path}"
                )
            if loop.time() > end:
                await self.stop()
                raise RuntimeError(f"etcd not healthy within {timeout_s:.0f}s; see {self.log_path}")
            await asyncio.sleep(0.05)  # another process: polling is the only way to know

    async def healthy(self) -> bool:
        """True when etcd answers /health with health true."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.client_port), 1.0
            )
        except (OSError, TimeoutError):
            return False
        try:
            writer.write(f"GET /health HTTP/1.0\r\nHost: {self.address}\r\n\r\n".encode())
            body = await asyncio.wait_for(reader.read(4096), 1.0)
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return b'"health":"true"' in body.replace(b" ", b"")

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM by pid, SIGKILL after grace_s; idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            await procs.terminate(proc, grace_s)


def child_command(data_dir: Path, host: str, client_port: int, peer_port: int) -> list[str]:
    """The `galaxy up` child that runs etcd (see the module docstring)."""
    return [
        sys.executable, "-m", "controlplane.launch.etcd", "--data-dir", str(data_dir),
        "--host", host, "--client-port", str(client_port), "--peer-port", str(peer_port),
    ]  # fmt: skip


async def _main(args: argparse.Namespace) -> int:
    etcd = LocalEtcd(
        Path(args.data_dir), host=args.host, client_port=args.client_port, peer_port=args.peer_port
    )
    await etcd.start()
    assert etcd.proc is not None
    address = etcd.address
    ready = {"kind": "etcd", "id": "etcd", "address": address, "metrics": address,
             "pid": etcd.proc.pid, "state": etcd.url}  # fmt: skip
    print(READY_PREFIX + json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch_lifeline(stop)
    exited = asyncio.ensure_future(etcd.proc.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([exited, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    code = etcd.proc.returncode if etcd.proc is not None else None
    await etcd.stop()
    # etcd dying on its own is a failure the supervisor should see and restart.
    return 0 if code is None else (code or 1)


def main() -> int:
    """Run one etcd as a supervised child."""
    p = argparse.ArgumentParser(prog="python -m controlplane.launch.etcd")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--client-port", type=int, required=True)
    p.add_argument("--peer-port", type=int, required=True)
    return asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
