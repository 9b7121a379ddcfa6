"""A real etcd server for tests, plus pytest fixtures that share one per session.

``EtcdServer`` runs ``/usr/bin/etcd`` (Debian package ``etcd-server``) on free
loopback ports with its own data directory. It can be stopped and started again
on the same data dir and the same ports, so tests can simulate an outage and a
recovery without clients having to learn a new address.

Use it from any conftest as a pytest plugin (in the top-level ``tests/conftest.py``)::

    pytest_plugins = ["tests.etcd_server"]

which provides the session-scoped ``etcd_server`` fixture and the function-scoped
``etcd_url`` fixture (an ``etcd://127.0.0.1:PORT`` URL for ``statestore.open_store``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ETCD_BINARY = os.environ.get("GALAXY_ETCD_BINARY", "/usr/bin/etcd")

# An external process gets a bounded number of seconds to become healthy or to exit;
# beyond that something is wrong with the machine and the test should fail loudly.
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.05


def etcd_binary() -> str | None:
    """Path of the etcd binary, or None when it is not installed."""
    if os.path.isfile(ETCD_BINARY) and os.access(ETCD_BINARY, os.X_OK):
        return ETCD_BINARY
    return shutil.which("etcd")


def require_etcd() -> str:
    """Return the etcd binary path or skip the calling test."""
    binary = etcd_binary()
    if binary is None:
        pytest.skip("etcd binary not found: install etcd-server (apt-get install etcd-server)")
    return binary


def _free_port() -> int:
    # The port is released before etcd binds it; a collision is possible but unlikely
    # on loopback, and start() reports it clearly if it happens.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EtcdServer:
    """One single-member etcd cluster on loopback, owned by the test process.

    Ports are chosen once (at construction) and kept across ``stop()``/``start()``
    so that clients configured with ``endpoint`` keep working after a restart.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        name: str = "default",
        tls_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``tls_dir``: serve clients over TLS and require a client certificate
        (``--client-cert-auth``), with ``ca.pem`` and ``etcd.pem``/``etcd-key.pem``
        from that directory (``controlplane.runtime.tls`` file names)."""
        self.binary = require_etcd()
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        self.data_dir = Path(data_dir)
        self.name = name
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.data_dir.parent / f"{self.data_dir.name}.etcd.log"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """A ``statestore.open_store`` URL for this server."""
        return f"{'etcds' if self.tls_dir else 'etcd'}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        """Process id while running, else None."""
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        """True while the etcd process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def _tls_args(self) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        return [
            "--cert-file", str(d / "etcd.pem"),
            "--key-file", str(d / "etcd-key.pem"),
            "--trusted-ca-file", str(d / "ca.pem"),
            "--client-cert-auth",
        ]  # fmt: skip

    def _command(self) -> list[str]:
        scheme = "https" if self.tls_dir else "http"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            # Short raft timers: a single member elects itself faster after a restart,
            # and the server-enforced minimum lease TTL drops to one second.
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            "--log-level",
            "warn",
            *self._tls_args(),
        ]

    def start(self) -> None:
        """Start etcd and block until ``/health`` reports healthy.

        Blocking is fine in a sync fixture; from async code use
        ``await asyncio.to_thread(server.start)``.
        """
        if self.is_running():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _health_context(self) -> ssl.SSLContext | None:
        if self.tls_dir is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
        ctx.load_cert_chain(self.tls_dir / "client" / "etcd-health.pem",
                            self.tls_dir / "client" / "etcd-health-key.pem")  # fmt: skip
        return ctx

    def _wait_healthy(self) -> None:
        scheme = "https" if self.tls_dir else "http"
        health_url = f"{scheme}://127.0.0.1:{self.client_port}/health"
        context = self._health_context()
        deadline = time.monotonic() + _START_TIMEOUT_S
        last_error = "no answer yet"
        # Polling is the only way to learn when an external process is ready.
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with code {self._proc.returncode} during start-up; "
                    f"see {self._log_path}:\n{self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(health_url, timeout=1.0, context=context) as resp:
                    body = resp.read().decode()
                    if resp.status == 200 and '"health":"true"' in body.replace(" ", ""):
                        return
                    last_error = f"HTTP {resp.status}: {body}"
            except (OSError, urllib.error.URLError) as e:
                last_error = str(e)
            time.sleep(_POLL_INTERVAL_S)
        raise RuntimeError(
            f"etcd on {self.endpoint} not healthy after {_START_TIMEOUT_S}s "
            f"({last_error}); see {self._log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process by its pid: SIGTERM, wait, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_TIMEOUT_S)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_etcd(data_dir: str | os.PathLike[str]) -> Iterator[EtcdServer]:
    """Context manager: a started EtcdServer that is stopped on exit."""
    server = EtcdServer(data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --- pytest plugin: load with ``pytest_plugins = ["tests.etcd_server"]`` ---


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd server shared by the whole session (skips if etcd is missing).

    Tests sharing it must scope their keys (e.g. a unique prefix per test).
    """
    with running_etcd(tmp_path_factory.mktemp("etcd-session") / "data") as server:
        yield server


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """``etcd://127.0.0.1:PORT`` of the session etcd server."""
    return etcd_server.url
