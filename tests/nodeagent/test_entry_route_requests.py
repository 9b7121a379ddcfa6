"""A door's answers to route requests, over real sockets on the node's
address: it routes (the agent's callback gets the caller's address and
source port) only for a good token, answers itself and passes nothing on
to the instance; a door that does not route says so. An aiohttp server
stands for the instance (the kernel path is tested in test_entry_routed.py)."""

from __future__ import annotations

import asyncio
import os

from controlplane.nodeagent.entry.door import Door
from controlplane.runtime.leasetoken import ROUTE_TTL_MS, LeaseKey

from .conftest import host_dial, stand_in
from .test_entry import node_address, now_ms


async def exchange(door: Door, *heads: bytes) -> bytes:
    """Send heads on one connection, each but the last once the answer to
    the one before has come (ending in the stand-in's body, ``hi``); what
    comes back until the door closes."""
    assert door._server is not None
    host, port = door._server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
    reader, writer = await asyncio.open_connection(host, port)
    got = b""
    try:
        for h in heads[:-1]:
            writer.write(h)
            got += await asyncio.wait_for(reader.readuntil(b"hi"), 5)
        writer.write(heads[-1])
        return got + await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def route_head(value: str) -> bytes:
    return (
        f"POST / HTTP/1.1\r\nHost: x\r\nGalaxy-Route: {value}\r\nContent-Length: 0\r\n\r\n".encode()
    )


async def test_a_good_token_routes_its_source_port_and_nothing_reaches_the_instance():
    key = LeaseKey(os.urandom(32))
    seen: list[int] = []
    asked: list[tuple[str, int]] = []
    async with stand_in(lambda: seen.append(1)) as port:
        door = Door("inst-0", port, key, host_dial)
        await door.open(node_address(), 0)
        door.route = lambda peer, source: asked.append((peer, source)) or None  # type: ignore[func-returns-value]
        try:
            good = key.route_key().sign_route(door.port, 40123, now_ms() + ROUTE_TTL_MS)
            answer = await exchange(door, route_head(f"40123:{good}"))
            assert answer.startswith(b"HTTP/1.1 204"), answer
            assert asked == [(node_address(), 40123)]
            answer = await exchange(door, route_head(f"40124:{good}"))  # not its port
            assert answer.startswith(b"HTTP/1.1 403"), answer
            answer = await exchange(door, route_head("not-a-port:x"))
            assert answer.startswith(b"HTTP/1.1 401"), answer
            door.route = lambda peer, source: "nft: no table"
            answer = await exchange(door, route_head(f"40123:{good}"))
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert asked == [(node_address(), 40123)] and seen == []
        finally:
            await door.close()


async def test_a_door_that_relays_says_so_and_a_kept_connection_cannot_ask():
    key = LeaseKey(os.urandom(32))
    seen: list[int] = []
    async with stand_in(lambda: seen.append(1)) as port:
        door = Door("inst-0", port, key, host_dial)
        await door.open(node_address(), 0)
        try:
            token = key.route_key().sign_route(door.port, 40123, now_ms() + ROUTE_TTL_MS)
            answer = await exchange(door, route_head(f"40123:{token}"))
            assert answer.startswith(b"HTTP/1.1 404") and b"Galaxy-Lease" in answer, answer
            door.route = lambda peer, source: None
            lease = key.sign("inst-0", now_ms() + 60_000)
            first = (
                f"POST /echo HTTP/1.1\r\nHost: x\r\nGalaxy-Lease: {lease}\r\n"
                "Content-Length: 2\r\n\r\nhi"
            ).encode()
            answer = await exchange(door, first, route_head(f"40123:{token}"))
            assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 401" in answer, answer
            assert seen == [1]  # the first request only
        finally:
            await door.close()
