"""Separate hosts on one machine: Linux network namespaces on a bridge.

``Hosts`` builds a bridge in the root namespace (the "control host") and one
namespace per extra host, each joined to the bridge by a veth pair, with
addresses in a /24 no interface here uses yet. Everything it creates carries
a random tag and is removed by ``close``: processes still running inside a
namespace are killed by PID (``ip netns pids``), then the namespaces and the
bridge are deleted.

``cluster`` starts a control plane on the control host and one node agent
on each other host, with TLS (each agent's certificate names its host).

Needs root and iproute2. Outside CI a test using it is skipped when either
is missing; in CI (``CI`` set) that is a failure, so the test never silently
stops running.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.launch.up import Supervisor, UpConfig
from controlplane.runtime import tls
from controlplane.runtime.host import serve_command


def _ip(*args: str) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def require_netns() -> None:
    """Skip (or, in CI, fail) unless namespaces can be made here."""
    why = None
    if os.geteuid() != 0:
        why = "network namespaces need root"
    elif shutil.which("ip") is None:
        why = "network namespaces need iproute2 (`ip`)"
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run this test (.ci/run installs iproute2)")
    pytest.skip(why)


def _free_subnet() -> str:
    """A 10.x.y prefix that no interface here has an address in."""
    used = _ip("-4", "-o", "addr")
    for _ in range(100):
        prefix = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet found")


@dataclass
class Hosts:
    """The control host (root namespace, on the bridge) and n other hosts."""

    tag: str = field(default_factory=lambda: f"{random.randrange(16**4):04x}")
    prefix: str = field(default_factory=_free_subnet)
    namespaces: list[str] = field(default_factory=list)
    bridge: str = ""

    @property
    def control_ip(self) -> str:
        """The root namespace's address on the bridge."""
        return f"{self.prefix}.1"

    def ip(self, i: int) -> str:
        """Address of host i (0-based)."""
        return f"{self.prefix}.{11 + i}"

    def create(self, n: int) -> Hosts:
        """Build the bridge and n namespaces (undone by close, even halfway)."""
        self.bridge = f"gxb{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.control_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(n):
            ns = f"galaxy-{self.tag}-{i}"
            outer, inner = f"gxv{self.tag}{i}", f"gxp{self.tag}{i}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # A default route, so "the address of the outgoing interface"
            # means something inside the namespace (see runtime.netaddr).
            _ip("-n", ns, "route", "add", "default", "via", self.control_ip)
        return self

    def exec_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a command on host i (``ip netns exec``
        execs the command, so its PID is the command's own)."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def close(self) -> None:
        """Kill what still runs in the namespaces, delete them and the bridge."""
        for ns in self.namespaces:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                for pid in _ip("netns", "pids", ns).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("netns", "del", ns)  # takes its veth end, and so the pair, along
        self.namespaces.clear()
        if self.bridge:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("link", "del", self.bridge)
            self.bridge = ""


@contextlib.asynccontextmanager
async def cluster(
    run_dir: Path,
    n: int,
    listen: Callable[[Hosts, int], str] = Hosts.ip,
    agent_args: tuple[str, ...] = (),
) -> AsyncIterator[tuple[Supervisor, Hosts]]:
    """A control plane on the control host and a node agent (node prefix
    ``host<i>``) on each of n hosts, listening on ``listen(hosts, i)`` (its
    host's address by default) with ``agent_args``; all stopped and removed
    on exit. Skips (fails in CI) where namespaces cannot be made."""
    require_netns()
    hosts = Hosts()
    sup: Supervisor | None = None
    try:
        hosts.create(n)
        cfg = UpConfig.for_tool(
            host=hosts.control_ip, nodes=0, gateway_port=0, run_dir=run_dir, tls=True
        )
        sup = Supervisor(cfg)
        endpoints = await sup.start()
        # Each host's node agent is dialled at its own address: its
        # certificate must name it (as `galaxy certs issue` would per host).
        assert sup.tls_dir is not None
        tls.ensure(sup.tls_dir, ["nodeagent"], [hosts.ip(i) for i in range(n)])
        for i in range(n):
            cmd = serve_command(
                "nodeagent", f"agent-ns{i}", listen(hosts, i), "--tls-dir", str(sup.tls_dir)
            )
            cmd += ["--controller", endpoints["controller"], "--node-prefix", f"host{i}"]
            cmd += ["--log-dir", str(run_dir / "instances"), *agent_args]
            await sup.spawn(f"agent-ns{i}", hosts.exec_prefix(i) + cmd)
        assert await sup.wait_nodes_registered(timeout_s=30, count=n) == n
        yield sup, hosts
    finally:
        if sup is not None:
            await sup.stop()
        hosts.close()
