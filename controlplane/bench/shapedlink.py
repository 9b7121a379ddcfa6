"""Another host behind a slow link, for the benches: a Linux network
namespace joined to this one by a veth pair, rate-limited both ways with
``tc`` (a token bucket, ``tbf``, on each end): ``ShapedHost``. The
model bench's store (``ShapedStore``) is an HTTP file server (the standard
library's, in its own process) inside one; the KV-transfer bench runs a
decode instance in one. This kernel has no ``netem`` qdisc, so no delay is added: the
link's round trip is what veth gives (tens of microseconds), and ``rtt``
measures it.
The link's real throughput is measured (``measure``), never assumed from the
shaping. Needs root and iproute2; everything is removed by ``close`` (the
server killed by PID, then the namespace, which takes the veth pair along).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Self


def _run(*args: str) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class ShapedHost:
    """Another host: a namespace joined to this one by a veth pair shaped to
    ``rate_mbit`` each way (unshaped when None)."""

    def __init__(self, rate_mbit: float | None, prefix: str = "galaxy-host") -> None:
        tag = f"{random.randrange(16**4):04x}"
        self.ns = f"{prefix}-{tag}"
        self.outer, self.inner = f"gxso{tag}", f"gxsi{tag}"
        net = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
        self.client_ip, self.host_ip = f"{net}.1", f"{net}.2"
        self.rate_mbit = rate_mbit
        self._made = False

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        """Command prefix that runs a command inside the namespace."""
        return ("ip", "netns", "exec", self.ns)

    def start(self) -> Self:
        """Build the namespace, link and shaping, then ``_started`` (what a
        subclass runs there); everything made so far is removed if a step fails."""
        try:
            self._build()
            self._started()
            return self
        except BaseException:
            self.close()
            raise

    def _started(self) -> None:
        """Hook: start what runs on the host."""

    def _build(self) -> None:
        _run("ip", "netns", "add", self.ns)
        self._made = True
        _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _run("ip", "link", "set", self.inner, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.client_ip}/30", "dev", self.outer)
        _run("ip", "link", "set", self.outer, "up")
        ns = self.exec_prefix
        _run(*ns, "ip", "addr", "add", f"{self.host_ip}/30", "dev", self.inner)
        _run(*ns, "ip", "link", "set", self.inner, "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            # Both directions are shaped (a store sends, a KV receiver
            # receives): a token bucket on each end's egress. The bucket
            # holds 4 ms of traffic (at least 32 KiB), the queue 50 ms.
            burst = max(32 * 1024, int(self.rate_mbit * 1e6 / 8 * 0.004))
            tbf = ("root", "tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst),
                   "latency", "50ms")  # fmt: skip
            _run(*ns, "tc", "qdisc", "add", "dev", self.inner, *tbf)
            _run("tc", "qdisc", "add", "dev", self.outer, *tbf)

    def close(self) -> None:
        """Kill what runs in the namespace (by PID), remove it and the link."""
        if self._made:
            with contextlib.suppress(RuntimeError):
                for pid in _run("ip", "netns", "pids", self.ns).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(RuntimeError):
                _run("ip", "netns", "del", self.ns)
            self._made = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShapedStore(ShapedHost):
    """An HTTP store serving ``root`` from a namespace behind a shaped veth."""

    def __init__(self, root: Path, rate_mbit: float, port: int = 8000) -> None:
        super().__init__(rate_mbit, prefix="galaxy-store")
        self.store_ip = self.host_ip
        self.port = port
        self.root = root
        self.server: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://STORE_IP:PORT``."""
        return f"http://{self.store_ip}:{self.port}"

    def _started(self) -> None:
        self.server = subprocess.Popen(
            [*self.exec_prefix, sys.executable, "-m", "http.server", str(self.port),
             "--bind", self.store_ip, "--directory", str(self.root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while True:  # an external process: poll until it answers
            try:
                urllib.request.urlopen(self.base_url + "/", timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise RuntimeError("the model store did not start") from None
                time.sleep(0.05)

    def measure(self, name: str) -> float:
        """Download root/name once over the link; its throughput in bytes/s."""
        t0 = time.perf_counter()
        n = 0
        with urllib.request.urlopen(f"{self.base_url}/{name}", timeout=600) as r:
            while chunk := r.read(1 << 20):
                n += len(chunk)
        return n / (time.perf_counter() - t0)

    def rtt(self, count: int = 5) -> float:
        """Median TCP connect time to the store, seconds (one round trip)."""
        import socket
        import statistics

        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            with socket.create_connection((self.store_ip, self.port), timeout=5):
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
