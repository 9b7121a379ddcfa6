"""IPv4 forwarding for routed entries (a root agent's).

A connection from another host that the node's NAT sends to an instance's
veth is forwarded: it arrives on the node's interface and leaves by the
veth, and its answers come back the other way. Linux forwards a packet only
when the interface it arrives on allows it (``net.ipv4.conf.IF.forwarding``;
``net.ipv4.ip_forward`` sets every interface's), and a host that is not a
router allows none. Kubernetes nodes and Docker hosts allow it already;
then nothing here changes. Otherwise the agent allows it on two kinds of
interface only: each instance's veth (``routing.HostRoutes.attach``; the
guard lets nothing but answers out of it) and the one interface that holds
the node's address, whose forwarded packets the guard then limits to those
going to the instances (``routing.HostRoutes.forward``), so that the node
does not become a router for anything else. Callers on the node itself
need none of this (their connections are not forwarded). A marker in /run
(per network namespace and interface, gone at reboot with the setting
itself) tells later agents of the host that Galaxy allowed it; the last
agent to stop disallows it again.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _conf(ifname: str) -> Path:
    return Path(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding")


def _marker(ifname: str) -> Path:
    netns = os.stat("/proc/self/ns/net").st_ino
    return Path(f"/run/galaxy-entry-forwarding.{netns}.{ifname}")


def interface_of(address: str) -> str | None:
    """The interface that holds address in this network namespace (None: none)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and parts[3].split("/")[0] == address:
            return parts[1]
    return None


def allow(ifname: str) -> bool:
    """Forwarding allowed on ifname; True when Galaxy allowed it (this agent
    or an earlier one of this host), False when it was already (the host's
    own choice, left alone)."""
    marker = _marker(ifname)
    if not marker.exists() and _conf(ifname).read_text().strip() != "0":
        return False
    marker.write_text("")
    _conf(ifname).write_text("1")
    return True


def allow_veth(ifname: str) -> None:
    """Forwarding allowed on an instance's veth (its answers go on)."""
    _conf(ifname).write_text("1")


def restore(others: bool) -> None:
    """Disallow forwarding again wherever Galaxy allowed it in this network
    namespace, once no other agent of the host routes (others): the last
    agent out does it, whichever allowed it."""
    if others:
        return
    for marker in _marker("*").parent.glob(_marker("*").name):
        ifname = marker.name.split(".", 2)[2]  # (a name may hold dots: eth0.100)
        try:
            _conf(ifname).write_text("0")
        except OSError:
            pass  # the interface is gone, and its setting with it
        marker.unlink(missing_ok=True)
