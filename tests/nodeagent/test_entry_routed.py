"""Routed entries with real sandboxes, real nftables and clients we did not
write (curl, aiohttp): a connection the door admitted with a route token
reaches the instance through the kernel, with no relay; every other
connection still meets the door, and the veth opens nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.entry import netns, routes
from controlplane.nodeagent.entry.routing import HostRoutes, Routes
from controlplane.nodeagent.sandbox import BwrapBackend, egressdeny
from controlplane.nodeagent.sandbox.uidpool import UidPool
from controlplane.runtime.leasetoken import ROUTE_TTL_MS, SKEW_MS, LeaseKey
from controlplane.sdk import entryroute
from controlplane.sdk.http import HttpPool
from tests.cluster import eventually

from .conftest import echo_spec
from .test_entry import metrics, node_address, now_ms

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("bwrap") is None
        or shutil.which("curl") is None
        or not netns.can_enter()
        or egressdeny.unusable() is not None,
        reason="needs bubblewrap, curl, nftables and a root agent",
    ),
]


def routed(outcome: str) -> float:
    return REGISTRY.get_sample_value("galaxy_entry_routes_total", {"outcome": outcome}) or 0.0


def free_port(host: str) -> int:
    """A source port nothing holds now (curl binds it next), above the
    ephemeral range, so that no connection of this host (the route
    request's own, say) is given it meanwhile."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        top = int(f.read().split()[1])
    for port in random.sample(range(top + 1, 65536), min(64, 65535 - top)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port above the ephemeral range")


async def curl(*args: str) -> tuple[int, str]:
    p = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-m", "5", "-w", "\n%{http_code}", *args, stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await p.communicate()
    body, _, code = out.decode().rpartition("\n")
    return int(code or 0), body


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[tuple[LeaseKey, Routes, BwrapBackend]]:
    """A backend whose instances are routed (this process's own tables)."""
    key = LeaseKey(os.urandom(32))
    host = node_address()
    rt = Routes(
        routes.RoutePool(routes.parse_subnet(routes.DEFAULT_SUBNET), start=os.getpid()),  # type: ignore[arg-type]
        HostRoutes(routes.DEFAULT_SUBNET, loopback=host.startswith("127.")),
    )
    assert rt.start(host) is None
    b = BwrapBackend(
        log_dir=tmp_path / "logs",
        instance_dir=tmp_path / "inst",
        uid_pool=UidPool(lock_dir=tmp_path / "uids"),
        lease_key=key,
        routes=rt,
    )
    b.host = host
    try:
        yield key, rt, b
    finally:
        await b.close()
        rt.stop()


def ask(key: LeaseKey, port: int, source: int, *, ttl_ms: int = ROUTE_TTL_MS) -> str:
    return f"Galaxy-Route: {source}:{key.route_key().sign_route(port, source, now_ms() + ttl_ms)}"


async def test_an_admitted_connection_reaches_the_instance_past_the_door(cluster):
    key, rt, b = cluster
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    host = a.host
    slot = rt.slot("inst-a")
    assert slot is not None and slot.ifname in os.listdir("/sys/class/net")
    before, admitted = metrics(), routed("admitted")
    source = free_port(host)
    code, _ = await curl("-H", ask(key, a.port, source), f"http://{a.address}/")
    assert code == 204
    assert routed("admitted") == admitted + 1
    # From that port, with no lease at all: the door never sees it.
    code, body = await curl("--local-port", str(source), "-d", "hello", f"http://{a.address}/echo")
    assert code == 200 and json.loads(body)["echo"] == "hello", body
    after = metrics()
    assert after["connections"] == before["connections"] + 1  # the route request's only
    # Any other port meets the door, which wants a lease.
    code, body = await curl("-d", "hello", f"http://{a.address}/echo")
    assert code == 401 and "Galaxy-Lease" in body, body


async def _from_port(host: str, source: int, address: str) -> bytes:
    """One request with no lease from host:source to address, and its
    answer; the connection reset at the end (no TIME_WAIT holds the port)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, source))
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        dst, port = address.rsplit(":", 1)
        await asyncio.wait_for(loop.sock_connect(s, (dst, int(port))), 5)
        await loop.sock_sendall(s, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        return await asyncio.wait_for(loop.sock_recv(s, 65536), 5)
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()


async def test_an_admission_opens_one_connection_only(cluster):
    """The connection's first packet uses its admission up: the same port
    again, within the admission's seconds, meets the door."""
    key, _, b = cluster
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    source = free_port(a.host)
    code, _ = await curl("-H", ask(key, a.port, source), f"http://{a.address}/")
    assert code == 204
    first = await _from_port(a.host, source, a.address)
    assert first.startswith(b"HTTP/1.") and b" 200 " in first.split(b"\r\n")[0], first
    again = await _from_port(a.host, source, a.address)
    assert again.startswith(b"HTTP/1.1 401"), again


async def test_route_tokens_are_checked_and_a_refused_port_meets_the_door(cluster):
    key, _, b = cluster
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    source = free_port(a.host)
    refused = routed("refused")
    stranger = LeaseKey(os.urandom(32))
    cases = [
        (ask(stranger, a.port, source), 403),  # another cluster's key
        (ask(key, a.port + 1, source), 403),  # made for another entry
        # made for another source port
        (f"Galaxy-Route: {source}:{ask(key, a.port, source + 1).split(':')[2]}", 403),
        (ask(key, a.port, source, ttl_ms=-SKEW_MS - 1_000), 401),  # ended
        (f"Galaxy-Route: {source}:not-a-token", 401),
        ("Galaxy-Route: 0:x", 401),
    ]
    for header, status in cases:
        code, body = await curl("-H", header, f"http://{a.address}/")
        assert code == status, (header, body)
    assert routed("refused") == refused + len(cases)
    code, body = await curl("--local-port", str(source), "-d", "x", f"http://{a.address}/echo")
    assert code == 401, body


async def test_the_veth_opens_nothing_but_admitted_connections(cluster):
    """From the node, the instance's own address on its veth is closed to
    anything the map did not send there; the veth ends with the instance."""
    _, rt, b = cluster
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    slot = rt.slot("inst-a")
    assert slot is not None
    with pytest.raises(OSError):  # dropped by the guard: a timeout
        socket.create_connection((slot.inner, a.port), timeout=1.5).close()
    code, _ = await curl("-m", "2", "-d", "x", f"http://{slot.inner}:{a.port}/echo")
    assert code == 0
    if rt.host.forwarding is not None:
        # Galaxy allowed forwarding on the node's interface: to the instances only.
        p = await asyncio.create_subprocess_exec(
            "nft", "list", "chain", "ip", f"galaxy_guard_{rt.host.pid}", "forwarded",
            stdout=subprocess.PIPE,
        )  # fmt: skip
        chain = (await p.communicate())[0].decode()
        rule = f'iifname "{rt.host.forwarding}" ip daddr != {routes.DEFAULT_SUBNET} drop'
        assert rule in chain, chain
    held = rt.pool.held
    await a.stop()
    assert rt.pool.held == held - 1 and rt.slot("inst-a") is None
    await eventually(lambda: slot.ifname not in os.listdir("/sys/class/net"), what="the veth gone")


async def test_the_gateways_pool_routes_and_falls_back_to_the_door(cluster, tmp_path):
    """The SDK's pool with a router (the gateway's): a routed entry gets
    its connections through the kernel, one that relays (here, a backend
    without routes) through its door, and both answer."""
    key, _, b = cluster
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    plain = BwrapBackend(
        log_dir=tmp_path / "plain-logs",
        instance_dir=tmp_path / "plain-inst",
        uid_pool=UidPool(lock_dir=tmp_path / "uids"),
        lease_key=key,
    )
    plain.host = b.host
    c = await plain.start("n1", "inst-c", echo_spec("team-c-fn"))
    value = REGISTRY.get_sample_value
    name = "galaxy_gateway_entry_routes_total"
    got = {o: value(name, {"outcome": o}) for o in ("routed", "relayed")}
    pool = HttpPool(router=entryroute.EntryRouter(key.route_key()))
    try:
        for sb, iid in ((a, "inst-a"), (c, "inst-c")):
            for i in range(3):
                lease = key.sign(iid, now_ms() + 60_000)
                async with pool.open(sb.address, "/echo", b"r%d" % i, 5, lease=lease) as resp:
                    assert resp.status == 200
                    assert json.loads(await resp.read())["echo"] == f"r{i}"
        assert not a.entry.clients  # nothing through a's door
        assert c.entry.clients  # c's kept connection is at its door
        now = {o: value(name, {"outcome": o}) for o in got}
        assert now == {"routed": got["routed"] + 1, "relayed": got["relayed"] + 1}  # type: ignore[operator]
    finally:
        await pool.close()
        await plain.close()


def test_tables_of_agents_that_are_gone_are_removed():
    """An agent killed before it could remove its tables: the next agent of
    the host removes them at its start."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = HostRoutes(routes.DEFAULT_SUBNET, pid=gone.pid)
    assert dead.install() is None
    names = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"galaxy_route_{gone.pid}" in names
    ours = HostRoutes(routes.DEFAULT_SUBNET)  # this process: an agent alive
    try:
        assert ours.install() is None
        names = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert f"galaxy_route_{gone.pid}" not in names and f"galaxy_guard_{gone.pid}" not in names
        assert f"galaxy_route_{os.getpid()}" in names
    finally:
        ours.remove()
