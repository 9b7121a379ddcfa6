"""A `galaxy serve gateway` subprocess with no control plane behind it
(its controller address refuses connections): what the gateway refuses on
its own is tested against it, its memory read from /proc and its log from
stderr."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from controlplane.runtime.host import READY_PREFIX


@dataclass
class GatewayProc:
    proc: subprocess.Popen[str]
    address: str
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def peak_rss(self) -> int:
        """The process's peak resident memory (bytes; VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _most_files(pid: int) -> None:
    """Let the gateway open as many files as the hard limit allows (the
    slow-client measurement holds tens of thousands of connections). Set
    on the started child, not in a ``preexec_fn``: with gRPC channels open
    in this process, grpcio 1.80+ can crash the forked child before its
    exec (grpc/grpc#43055, "epoll_wait error: Bad file descriptor")."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))


@contextmanager
def gateway_proc(tmp: Path, *flags: str, controller: str = "127.0.0.1:1") -> Iterator[GatewayProc]:
    """A gateway subprocess on a free loopback port, with flags (its
    controller: none that answers, unless given; plaintext gRPC)."""
    log = tmp / "gateway.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.tools.cli", "serve", "gateway", "--insecure",
             "--controller", controller, "--listen", "127.0.0.1:0", *flags],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    _most_files(proc.pid)  # before it reads its first connection
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                ready = json.loads(line[len(READY_PREFIX) :])
                break
        else:
            raise AssertionError(f"gateway exited: {log.read_text()[-2000:]}")
        yield GatewayProc(proc, ready["http"], log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
