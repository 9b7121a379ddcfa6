"""Start and stop a real `galaxy up` for tests, and check for leaked processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.tls import TlsConfig
from tests.clirun import run_cli

REPO = Path(__file__).resolve().parents[2]
READY_LINE = "Press Ctrl-C to stop."


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent will reap it).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class GalaxyUp:
    """A `galaxy up` subprocess with its own run dir."""

    def __init__(self, run_dir: Path, *args: str) -> None:
        self.run_dir = run_dir
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.endpoints: dict = {}

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a `galaxy` CLI command against this control plane, in this
        process (tests/clirun.py)."""
        return run_cli(["--run-dir", str(self.run_dir), *args], input=input, timeout=timeout)

    def cli_process(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """The same command in a real ``python -m controlplane.tools.cli``
        process, for a test whose point is the process."""
        return subprocess.run(
            [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(self.run_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=REPO,
        )

    def start(self, timeout: float = 90) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controlplane.tools.cli",
                "--run-dir",
                str(self.run_dir),
                "up",
                # Tests may run beside a real `galaxy up` on 8080: any free port.
                *(() if "--gateway-port" in self.args else ("--gateway-port", "0")),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            # A half-started control plane must not outlive the test: killing
            # the supervisor closes its children's lifelines.
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise
        self.endpoints = json.loads((self.run_dir / "endpoints.json").read_text())

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        # readline blocks until the supervisor prints: the ready line is the event.
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("galaxy up exited early:\n" + "".join(self.output))
            self.output.append(line)
            if READY_LINE in line:
                break
        else:
            raise AssertionError("galaxy up not ready:\n" + "".join(self.output))

    def wait_line(self, text: str, timeout: float = 60) -> str:
        """Read the supervisor's output until a line containing text."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            # The supervisor prints whole lines and flushes: wait for one.
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("galaxy up exited:\n" + "".join(self.output))
            self.output.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout}s:\n" + "".join(self.output))

    def reload_endpoints(self) -> None:
        """Read endpoints.json again (a restarted child has a new pid)."""
        self.endpoints = json.loads((self.run_dir / "endpoints.json").read_text())

    @property
    def controller(self) -> str:
        return str(self.endpoints["controller"])

    @property
    def token(self) -> str:
        """The admin token `galaxy up` made (RUN_DIR/token)."""
        return (self.run_dir / "token").read_text().strip()

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        """gRPC call metadata with the admin token."""
        return (("authorization", f"Bearer {self.token}"),)

    def tls(self, identity: str = "client/admin") -> TlsConfig:
        """The TLS files of identity in this control plane's certificates."""
        return TlsConfig.for_identity(self.endpoints["tls_dir"], identity)

    def channel(self, address: str, identity: str = "client/admin") -> grpc.aio.Channel:
        """An async mutual-TLS channel to a component, as identity."""
        return rpc.insecure_channel(address, self.tls(identity))

    def sync_channel(self, address: str, identity: str = "client/admin") -> grpc.Channel:
        """A blocking mutual-TLS channel (reflection's descriptor database)."""
        t = self.tls(identity)
        creds = grpc.ssl_channel_credentials(
            t.ca.read_bytes(), t.key.read_bytes(), t.cert.read_bytes()
        )
        return grpc.secure_channel(address, creds)

    def component(self, name: str) -> dict:
        return next(c for c in self.endpoints["components"] if c["name"] == name)

    def pids(self) -> list[int]:
        return [int(c["pid"]) for c in self.endpoints.get("components", [])]

    def stop(self, timeout: float = 60) -> str:
        """Ctrl-C the supervisor; returns the rest of its output."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
            raise AssertionError("galaxy up did not stop in time") from None
        self.output.append(rest)
        return rest

    def kill_leftovers(self, pids: list[int]) -> list[int]:
        """Kill (by PID) any listed process still alive; returns those."""
        left = [p for p in pids if pid_alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
        return left
