"""Addresses for routed entries (pure: no I/O).

A routed instance gets a veth pair between the node and its network
namespace, on a /30 of the node's entry subnet: the node's end at the
first address, the instance's at the second (``routing.py`` makes them).
The slot's number names the node's end (``gxe<N>``): the kernel refuses a
second interface of a name, so two agents of one host that pick the same
slot find out at once and take another, and a slot frees itself when its
instance's namespace ends, whatever happened to the agent.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

#: The default subnet: private, and far from Docker's, Kubernetes' and
#: slirp4netns's (10.0.2.0/24) defaults.
DEFAULT_SUBNET = "10.213.0.0/16"
#: The node's end of slot N is named PREFIX + N (at most 15 bytes).
PREFIX = "gxe"
#: The instance's end, inside its namespace.
INNER = "eth0"
#: Slots tried before a start gives up on routing (its door still relays).
TRIES = 8


@dataclass(frozen=True)
class Slot:
    """One /30: the node's end and the instance's."""

    index: int
    host: str
    inner: str

    @property
    def ifname(self) -> str:
        return f"{PREFIX}{self.index}"


def parse_subnet(text: str) -> ipaddress.IPv4Network | None:
    """The subnet of --entry-route-subnet ('' : routing off); ValueError
    naming the problem."""
    text = text.strip()
    if not text:
        return None
    shown = repr(text[:64])
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        raise ValueError(f"{shown} is not an IPv4 network (CIDR, e.g. {DEFAULT_SUBNET})") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ValueError(f"{shown}: routed entries are IPv4 only")
    if net.prefixlen > 28:
        raise ValueError(f"{shown}: at most /28 (each instance takes a /30)")
    return net


class RoutePool:
    """The slots of a subnet this agent holds. ``take`` proposes a free
    one; the caller confirms it (``hold``) once the kernel has made its
    interface, or skips it (``skip``) when the name was taken."""

    def __init__(self, subnet: ipaddress.IPv4Network, start: int = 0) -> None:
        self.subnet = subnet
        self.size = subnet.num_addresses // 4
        self._next = start % self.size
        self._held: set[int] = set()

    def slot(self, index: int) -> Slot:
        base = int(self.subnet.network_address) + 4 * index
        return Slot(
            index, str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))
        )

    def take(self) -> Slot | None:
        """The next slot this agent does not hold (None: it holds them all)."""
        for _ in range(self.size):
            i = self._next
            self._next = (self._next + 1) % self.size
            if i not in self._held:
                return self.slot(i)
        return None

    def hold(self, slot: Slot) -> None:
        self._held.add(slot.index)

    def release(self, slot: Slot) -> None:
        self._held.discard(slot.index)

    @property
    def held(self) -> int:
        return len(self._held)
