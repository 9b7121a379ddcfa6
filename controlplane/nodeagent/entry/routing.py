"""Routed entries: an admitted connection goes to the instance through the
kernel, with no relay in between (a root agent only).

The door relays every byte of a connection it admits: one more process to
wake per request each way, which costs a small request ~65 µs of node CPU
and, at concurrency 1, more than 10% of the gateway's throughput
(docs/security.md, "The node's entry"). Routed, the door still decides who
gets in, but per connection and ahead of it:

1. a caller holding the cluster's route key (the gateway) binds a socket,
   and asks the instance's door, with a route token for that source port
   (``RouteKey.sign_route``), to route it;
2. the door checks the token and adds {caller address . source port .
   door port} to this agent's nftables set, for ``ROUTE_TTL_S`` and one
   connection (the connection's first packet uses it up);
3. the caller connects from that port: the node's NAT sends the
   connection to the instance's end of a veth pair (``attach``), and
   inside the instance's namespace a second NAT sends it on to the
   loopback port the function listens on. Every later packet follows the
   connection (conntrack); nothing of it passes through the agent.

A connection without an admission goes to the door as before, which checks
every request's lease. The guard table drops whatever an instance sends
over its veth that is not an answer on such a connection, and any packet to
an instance's veth that was not sent there by the map, so that the veth
opens nothing else: not the node's services to the instance, not the
instance to the node's processes.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import re
import subprocess
import types
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter

from controlplane.nodeagent.entry import forwarding
from controlplane.nodeagent.entry.routes import INNER, TRIES, RoutePool, Slot

log = logging.getLogger(__name__)

#: How long an admission waits for its connection (the caller connects at once).
ROUTE_TTL_S = 3
#: Admissions the map holds at once (each lives ROUTE_TTL_S).
MAP_SIZE = 65_536
_TABLE = "galaxy_route_"
_GUARD = "galaxy_guard_"
#: The nftables table made in an instance's namespace.
INNER_TABLE = "galaxy_entry"

ROUTED = Counter(
    "galaxy_entry_routes_total",
    "Routed entries: instances given a veth (attached) or not (failed), "
    "connections admitted to the kernel path (admitted) or refused (refused)",
    ["outcome"],
)
for _outcome in ("attached", "failed", "admitted", "refused"):
    ROUTED.labels(_outcome)


def host_script(pid: int, subnet: str, max_entries: int = MAP_SIZE) -> str:
    """The node's tables of the agent of pid: the admissions' NAT, and the
    guard of every instance's veth, by the instances' subnet (not by
    interface names, which other software may share)."""
    net = f"ip daddr {subnet}"
    src = f"ip saddr {subnet}"
    # A connection's first packet that an admission names: the admission
    # is used up (one connection per admission), and the connection goes
    # to the instance of the door's port.
    key = "ip saddr . tcp sport . tcp dport"
    route = (
        f"meta l4proto tcp {key} @admitted delete @admitted {{ {key} }} "
        "dnat ip to tcp dport map @targets;"
    )
    return f"""
table ip {_TABLE}{pid} {{
  set admitted {{ type ipv4_addr . inet_service . inet_service;
    flags dynamic,timeout; size {max_entries}; }}
  map targets {{ type inet_service : ipv4_addr . inet_service; size {max_entries}; }}
  chain incoming {{ type nat hook prerouting priority -100; policy accept; {route} }}
  chain local {{ type nat hook output priority -100; policy accept; {route} }}
  chain leaving {{ type nat hook postrouting priority 100; policy accept;
    {net} ct status dnat masquerade; }}
}}
table ip {_GUARD}{pid} {{
  chain inbound {{ type filter hook input priority 0; policy accept;
    {src} ct state established,related accept; {src} drop; }}
  chain forwarded {{ type filter hook forward priority 0; policy accept;
    {src} ct state established,related accept; {src} drop;
    {net} ct status dnat accept; {net} drop; }}
  chain outbound {{ type filter hook output priority 0; policy accept;
    {net} ct status dnat accept; {net} drop; }}
}}
"""


def inner_script(port: int) -> str:
    """The instance's namespace: what the veth brings goes to the loopback
    port its function listens on."""
    return f"""
table ip {INNER_TABLE} {{
  chain incoming {{ type nat hook prerouting priority -100; policy accept;
    iifname "{INNER}" tcp dport {port} dnat ip to 127.0.0.1; }}
}}
"""


def _nft() -> types.ModuleType:
    """nftables' loader (the sandbox package's; imported here on first use,
    since that package imports this module)."""
    from controlplane.nodeagent.sandbox import egressdeny

    return egressdeny


def _run(argv: list[str], stdin: str = "") -> str | None:
    """argv's error, or None."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


class HostRoutes:
    """This agent's tables on the node (made by ``install``, removed by
    ``remove``) and its admissions."""

    def __init__(self, subnet: str, loopback: bool = False, pid: int | None = None) -> None:
        #: The instances' subnet (``routes.parse_subnet``): what the guard covers.
        self.subnet = subnet
        #: The entry's address is a loopback one: locally sent packets from
        #: 127.0.0.1 must be routable to the veth (route_localnet).
        self.loopback = loopback
        self.pid = os.getpid() if pid is None else pid
        self.installed = False
        #: The interface on which this agent allowed forwarding (``forward``).
        self.forwarding: str | None = None
        #: Without forwarding: the node's own addresses, the only callers
        #: routed (None: any caller).
        self.local_only: set[str] | None = None

    def install(self) -> str | None:
        """Remove the tables of agents of this host that are gone, then make
        this one's; why it could not, or None."""
        stale, _ = _tables(self.pid)
        if stale:
            _nft().apply("".join(f"delete table {t}\n" for t in stale))
        why = _nft().unusable() or _nft().apply(host_script(self.pid, self.subnet))
        self.installed = why is None
        return why

    def forward(self, address: str) -> str | None:
        """Let connections from other hosts to the node's address be
        forwarded to the instances, and nothing else (``forwarding``);
        why it could not, or None. Nothing to do for a loopback address."""
        if _is_loopback(address):
            return None
        ifname = forwarding.interface_of(address)
        if ifname is None:
            return f"no interface holds {address}: connections from other hosts relay"
        try:
            if not forwarding.allow(ifname):
                return None  # the host forwards already: its choice
        except OSError as e:
            return f"cannot allow IPv4 forwarding on {ifname}: {e}"
        self.forwarding = ifname
        log.info("entry: IPv4 forwarding allowed on %s, to the instances only", ifname)
        return _nft().apply(
            f'add rule ip {_GUARD}{self.pid} forwarded iifname "{ifname}" '
            f"ip daddr != {self.subnet} drop\n"
        )

    def remove(self) -> None:
        if self.installed:
            self.installed = False
            pid = self.pid
            _nft().apply(f"delete table ip {_TABLE}{pid}\ndelete table ip {_GUARD}{pid}\n")
            try:
                forwarding.restore(others=bool(_tables(pid)[1]))
            except OSError as e:
                log.warning("entry: cannot disallow IPv4 forwarding again: %s", e)

    def admit(self, peer: str, source_port: int, port: int) -> str | None:
        """Route the next connection from peer:source_port to port (the
        instance ``target`` names), if it comes within ROUTE_TTL_S; nft's
        error, or None."""
        if self.local_only is not None and peer not in self.local_only and not _is_loopback(peer):
            return "this node does not forward: only its own callers are routed"
        return _nft().apply(
            f"add element ip {_TABLE}{self.pid} admitted "
            f"{{ {peer} . {source_port} . {port} timeout {ROUTE_TTL_S}s }}\n"
        )

    def target(self, port: int, inner: str) -> str | None:
        """Admitted connections to port go to inner:port; nft's error, or None."""
        return _nft().apply(
            f"add element ip {_TABLE}{self.pid} targets {{ {port} : {inner} . {port} }}\n"
        )

    def untarget(self, port: int) -> None:
        """port names no instance any more (it ended)."""
        _nft().apply(f"delete element ip {_TABLE}{self.pid} targets {{ {port} }}\n")

    def attach(self, pid: int, slot: Slot, port: int) -> str | None:
        """Give the namespace of pid a veth on slot, its far end's port
        forwarded to the loopback (blocking: run it off the event loop).
        The pair ends with the namespace. Why it could not, or None ("File
        exists": the slot's name is another's)."""
        why = _run(
            ["ip", "-batch", "-"],
            f"link add {slot.ifname} type veth peer name {INNER} netns {pid}\n"
            f"link set {slot.ifname} addrgenmode none\n"
            f"addr add {slot.host}/30 dev {slot.ifname}\n"
            f"link set {slot.ifname} up\n",
        )
        if why is not None:
            return why
        try:
            if self.loopback:
                Path(f"/proc/sys/net/ipv4/conf/{slot.ifname}/route_localnet").write_text("1")
            forwarding.allow_veth(slot.ifname)  # answers to other hosts go on
            return _inside(pid, slot, port)
        except OSError as e:
            return str(e)


def _inside(pid: int, slot: Slot, port: int) -> str | None:
    """Configure the instance's end from this thread, inside its namespace
    (a child started from here is there too), then come back."""
    netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _nft().setns(netns)
        try:
            why = _run(
                ["ip", "-batch", "-"],
                f"link set {INNER} addrgenmode none\n"
                f"addr add {slot.inner}/30 dev {INNER}\n"
                f"link set {INNER} up\n",
            )
            if why is None:
                # The second NAT sends to 127.0.0.1: allowed from the veth.
                Path(f"/proc/sys/net/ipv4/conf/{INNER}/route_localnet").write_text("1")
                why = _nft().apply(inner_script(port))
            return why
        finally:
            try:
                _nft().setns(home)
            except OSError as e:
                # This pool thread would run whatever comes next inside the
                # instance's namespace: nothing may.
                log.critical("entry: cannot return from an instance's namespace: %s", e)
                os._exit(70)
    finally:
        os.close(netns)
        os.close(home)


_NAME = re.compile(rf"^table (ip) ((?:{_TABLE}|{_GUARD})(\d+))$")


def _tables(pid: int) -> tuple[list[str], list[str]]:
    """This host's route and guard tables of agents that are gone (their
    names, to delete) and the route tables of other agents still running
    (pid: this agent's own, neither)."""
    try:
        out = subprocess.run(
            ["nft", "list", "tables"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return [], []
    stale, others = [], []
    for line in out.splitlines():
        m = _NAME.match(line.strip())
        if m is None or int(m.group(3)) == pid:
            continue
        if not os.path.exists(f"/proc/{m.group(3)}"):
            stale.append(f"{m.group(1)} {m.group(2)}")
        elif m.group(2).startswith(_TABLE):
            others.append(m.group(2))
    return stale, others


class RoutedDoor(Protocol):
    """What ``Routes`` needs of a door (``door.Door``)."""

    instance_id: str
    port: int
    route: Callable[[str, int], str | None] | None


class Routes:
    """Routed entries of one agent: its tables, its slots, its instances'.

    ``start`` (at the agent's start) makes the tables; without them (no
    nftables, not root) ``usable`` is False and every door relays. ``open``
    gives an instance its veth and its door the power to admit; ``close``
    lets go of its slot (the veth ends with the namespace)."""

    def __init__(self, pool: RoutePool, host: HostRoutes | None = None) -> None:
        self.pool = pool
        self.host = host or HostRoutes(str(pool.subnet))
        self.usable = False
        #: routed instances: their slot and door port
        self._routed: dict[str, tuple[Slot, int]] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}

    def start(self, address: str) -> str | None:
        """Make the tables; address: the node's own (where callers from
        other hosts arrive). Why routing is off (None: on)."""
        self.host.loopback = _is_loopback(address)
        why = self.host.install()
        self.usable = why is None
        if why is None:
            far = self.host.forward(address)
            if far is not None:  # the node's own callers still route
                self.host.local_only = {address}
                log.warning("entry: connections from other hosts relay: %s", far)
        return why

    def stop(self) -> None:
        self.usable = False
        self.host.remove()

    def begin(self, door: RoutedDoor, pid: int) -> None:
        """Start ``open`` beside the function's own start (the veth takes a
        few milliseconds, the function tens); ``ready`` awaits it."""
        if self.usable:
            self._opening[door.instance_id] = asyncio.create_task(self.open(door, pid))

    async def ready(self, instance_id: str) -> None:
        """Once begin's work for instance_id is done (before its door opens)."""
        task = self._opening.pop(instance_id, None)
        if task is not None:
            await task

    async def open(self, door: RoutedDoor, pid: int) -> None:
        """Route door's instance (in pid's namespace). A failure is logged
        and counted: the door then relays, as it would without routing."""
        if not self.usable:
            return
        why = "no free slot"
        for _ in range(TRIES):
            slot = self.pool.take()
            if slot is None:
                break
            self.pool.hold(slot)
            err = await asyncio.to_thread(self.host.attach, pid, slot, door.port)
            if err is None:
                err = self.host.target(door.port, slot.inner)
            if err is None:
                self._routed[door.instance_id] = (slot, door.port)
                door.route = functools.partial(_admit, self.host, door.port)
                ROUTED.labels("attached").inc()
                return
            why = err
            self.pool.release(slot)
            if "File exists" not in why:
                break
        ROUTED.labels("failed").inc()
        log.warning("entry: instance %s is not routed (its door relays): %s", door.instance_id, why)

    def slot(self, instance_id: str) -> Slot | None:
        """The slot of a routed instance (None: not routed)."""
        routed = self._routed.get(instance_id)
        return None if routed is None else routed[0]

    def close(self, instance_id: str) -> None:
        task = self._opening.pop(instance_id, None)
        if task is not None:
            task.cancel()  # (a veth made meanwhile ends with the namespace)
        routed = self._routed.pop(instance_id, None)
        if routed is not None:
            slot, port = routed
            self.pool.release(slot)
            if self.usable:
                self.host.untarget(port)


def _admit(host: HostRoutes, port: int, peer: str, source_port: int) -> str | None:
    return host.admit(peer, source_port, port)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"
