"""Ports for process-sandbox instances: free now on the node's address,
drawn below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # the Linux default


# Instance ports are drawn below the kernel's ephemeral range: a port taken
# with bind(0) and released is soon handed to some outgoing connection or
# another bind(0) (other agents, gRPC servers), so the instance would race them.
_PORT_LOW = 10_000
_EPHEMERAL_LOW = _ephemeral_range()[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str, avoid: set[int]) -> int:
    """A port of host free right now (the instance binds it moments later)."""
    if _EPHEMERAL_LOW - _PORT_LOW >= 1000:
        for _ in range(64):
            port = random.randrange(_PORT_LOW, _EPHEMERAL_LOW)
            if port not in avoid and _port_is_free(host, port):
                return port
    while True:  # no room below the ephemeral range: let the kernel choose
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def instance_ports() -> tuple[int, int]:
    """The range [low, high) instances' ports are drawn from on every node
    (the whole unprivileged range when the ephemeral range leaves no room
    below it), which a node's KV relay sends to on other nodes."""
    if _EPHEMERAL_LOW - _PORT_LOW >= 1000:
        return _PORT_LOW, _EPHEMERAL_LOW
    return 1024, 65536
