"""The gateway's side of routed entries, over real sockets: an entry that
admits a route but whose node does not take the connection (no
forwarding, a firewall) costs one failed connect, and then the entry is
relayed through its door for a while; an entry that answers anything but
204 is relayed at once."""

from __future__ import annotations

import asyncio
import os
import socket

from prometheus_client import REGISTRY

from controlplane.runtime.leasetoken import LeaseKey
from controlplane.sdk.entryroute import EntryRouter


def count(outcome: str) -> float:
    value = REGISTRY.get_sample_value("galaxy_gateway_entry_routes_total", {"outcome": outcome})
    return value or 0.0


async def test_a_routed_connect_that_fails_relays_the_entry_from_then_on():
    router = EntryRouter(LeaseKey(os.urandom(32)).route_key())
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    failed = count("failed")
    assert await router.connect(sock, "127.0.0.1", dead) is False
    assert sock.fileno() == -1  # closed
    assert count("failed") == failed + 1
    assert await router.ask("127.0.0.1", dead) is None  # relayed: not asked again


async def test_an_entry_that_does_not_route_is_relayed_and_not_asked_again():
    asked = 0

    async def door(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal asked
        asked += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(door, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    router = EntryRouter(LeaseKey(os.urandom(32)).route_key())
    relayed = count("relayed")
    try:
        assert await router.ask("127.0.0.1", port) is None
        assert await router.ask("127.0.0.1", port) is None
    finally:
        server.close()
    assert asked == 1 and count("relayed") == relayed + 1
