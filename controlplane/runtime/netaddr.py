"""Host:port handling and the address a process tells others to use.

Every address Galaxy hands out (a component's, an instance's) must be one a
client on another host can reach: a process that listens on all interfaces
advertises the address of the interface that carries its outgoing traffic,
never loopback (unless loopback is all it has).
"""

from __future__ import annotations

import ipaddress
import logging
import socket

log = logging.getLogger(__name__)

#: Hosts that mean "every interface" when listening.
UNSPECIFIED = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError otherwise.

    The host comes back without brackets.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address[:80]!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    value = int(port)
    if value > 65535:
        raise ValueError(f"port {value} of address {address[:80]!r} is out of range")
    return host, value


def join_host_port(host: str, port: int) -> str:
    """ "host:port", with an IPv6 literal in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def is_unspecified(host: str) -> bool:
    """True for a listen host that means every interface."""
    return host.strip("[]") in {h.strip("[]") for h in UNSPECIFIED}


def outward_host(family: int = socket.AF_INET) -> str:
    """The local address of the interface that holds the default route.

    A UDP connect sends nothing; it only makes the kernel choose a source
    address. Falls back to the address the host name resolves to, then to
    loopback (a machine with no network at all), with a warning.
    """
    probe = "192.0.2.1" if family == socket.AF_INET else "2001:db8::1"  # TEST-NET / doc prefix
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))
            return str(s.getsockname()[0])
    except OSError:
        pass
    try:
        resolved = socket.gethostbyname(socket.gethostname())
        if not ipaddress.ip_address(resolved).is_loopback:
            return resolved
    except (OSError, ValueError):
        pass
    log.warning("no network interface with a route found: advertising loopback")
    return "127.0.0.1" if family == socket.AF_INET else "::1"


def advertised_host(listen_host: str, advertise_host: str | None = None) -> str:
    """The host others should use to reach a server listening on listen_host.

    advertise_host wins when given (a pod IP, a DNS name); a specific listen
    host is reachable as itself; "every interface" becomes the outward
    address (see outward_host).
    """
    if advertise_host:
        return advertise_host.strip("[]")
    host = listen_host.strip("[]")
    if is_unspecified(host):
        return outward_host(socket.AF_INET6 if ":" in host else socket.AF_INET)
    return host
