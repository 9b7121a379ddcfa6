"""The doors' bounds, over real sockets on the node's address: a connection
that shows no admitted request in time is answered 408 and closed (one
that did stays), and past the agent's connection bound a new connection
gets 503 at once; two doors share one bound. An aiohttp server stands for
the instances (the way into a namespace is tested in test_entry.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.entry.door import Door
from controlplane.nodeagent.entry.limits import EntryLimits
from controlplane.runtime.leasetoken import LeaseKey
from tests.cluster import eventually

from .conftest import host_dial, stand_in
from .test_entry import node_address, now_ms


@dataclass
class Doors:
    key: LeaseKey
    limits: EntryLimits
    doors: list[Door]

    async def connect(self, i: int = 0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        server = self.doors[i]._server
        assert server is not None
        host, port = server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
        return await asyncio.open_connection(host, port)

    def request(self, i: int = 0) -> bytes:
        token = self.key.sign(self.doors[i].instance_id, now_ms() + 60_000)
        return (
            f"POST /echo HTTP/1.1\r\nHost: x\r\nGalaxy-Lease: {token}\r\n"
            "Content-Length: 2\r\n\r\nhi"
        ).encode()


@pytest.fixture
async def doors(request: pytest.FixtureRequest) -> AsyncIterator[Doors]:
    """Two doors sharing the limits the test asks for (its parameter)."""
    limits = EntryLimits(**request.param)
    key = LeaseKey(os.urandom(32))

    async with stand_in() as port:
        made = [Door(f"inst-{i}", port, key, host_dial, limits=limits) for i in range(2)]
        for d in made:
            await d.open(node_address(), 0)
        yield Doors(key, limits, made)
        for d in made:
            await d.close()


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("galaxy_entry_refused_total", {"reason": reason}) or 0.0


async def status_of(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and head of the next answer."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return int(head.split()[1]), head


@pytest.mark.parametrize("doors", [{"head_s": 0.3}], indirect=True)
async def test_no_admitted_request_in_time_is_a_408_and_an_admitted_connection_stays(
    doors: Doors,
) -> None:
    before = refused("head_timeout")
    kept_r, kept_w = await doors.connect()
    kept_w.write(doors.request())
    assert (await status_of(kept_r))[0] == 200
    await kept_r.readexactly(2)
    # Opened after the kept one was admitted: its 408 comes later than the
    # kept connection's own deadline would have.
    silent_r, silent_w = await doors.connect()
    slow_r, slow_w = await doors.connect()
    slow_w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    for reader in (silent_r, slow_r):
        status, head = await status_of(reader)
        assert status == 408, head
        body = await asyncio.wait_for(reader.read(), 5)  # to the door's close
        assert b"no admitted request within 0.3s" in body and reader.at_eof(), body
    silent_w.close()
    slow_w.close()
    assert refused("head_timeout") - before == 2
    kept_w.write(doors.request())
    assert (await status_of(kept_r))[0] == 200  # still open
    kept_w.close()
    await eventually(lambda: doors.limits.open == 0, what="every connection closed")


@pytest.mark.parametrize("doors", [{"max_connections": 2}], indirect=True)
async def test_connections_past_the_agents_bound_get_a_503_at_once(doors: Doors) -> None:
    before = refused("full")
    first = await doors.connect(0)
    second = await doors.connect(1)  # the other door: the bound is shared
    await eventually(lambda: doors.limits.open == 2, what="two connections counted")
    third_r, third_w = await doors.connect(0)
    status, head = await status_of(third_r)
    assert status == 503 and b"Retry-After: 1" in head, head
    body = await asyncio.wait_for(third_r.read(), 5)
    assert b"2 connections open at this node" in body and third_r.at_eof(), body
    third_w.close()
    assert refused("full") - before == 1
    assert doors.limits.open == 2
    first[1].close()
    await eventually(lambda: doors.limits.open == 1, what="one closed")
    again_r, again_w = await doors.connect(0)
    again_w.write(doors.request(0))
    assert (await status_of(again_r))[0] == 200
    again_w.close()
    second[1].close()
    await eventually(lambda: doors.limits.open == 0, what="every connection closed")


@dataclass
class Counted:
    """A plain TCP server for the door to reach: counts its connections and
    answers each complete request head with 200."""

    port: int = 0
    connections: int = 0


@pytest.fixture
async def counted() -> AsyncIterator[tuple[Counted, Door, LeaseKey]]:
    got = Counted()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(x.split(b":")[1]) for x in head.split(b"\r\n") if b"length" in x.lower()),
                    0,
                )
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    got.port = server.sockets[0].getsockname()[1]
    key = LeaseKey(os.urandom(32))
    door = Door("inst-0", got.port, key, host_dial)
    await door.open(node_address(), 0)
    yield got, door, key
    await door.close()
    server.close()
    await server.wait_closed()


async def test_nothing_reaches_the_instance_before_a_first_request_is_admitted(
    counted: tuple[Counted, Door, LeaseKey],
) -> None:
    got, door, key = counted
    doors = Doors(key, door.limits, [door])
    # A head in three reads, its lease forged: no connection into the instance.
    reader, writer = await doors.connect()
    forged = key.sign("inst-0", now_ms() + 60_000)[:-4] + "AAAA"
    head = [b"POST /echo HTTP/1.1\r\n", b"Host: x\r\n", f"Galaxy-Lease: {forged}\r\n\r\n"]
    sent = 0
    for part in head[:2]:
        writer.write(part)
        sent += len(part)
        # Each part read on its own, and held (not sent into the instance).
        await eventually(
            lambda n=sent: sum(c.early_bytes for c in door.clients) == n, what=f"{sent} held"
        )
    writer.write(head[2].encode())
    assert (await status_of(reader))[0] == 403
    writer.close()
    # A head too long to be a request's, before any admitted request: 431.
    reader, writer = await doors.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nX-Filler: " + b"a" * (70 * 1024))
    assert (await status_of(reader))[0] == 431
    writer.close()
    # The same head in pieces with a good lease goes through whole, once.
    reader, writer = await doors.connect()
    good = doors.request()
    for i in range(0, len(good), 16):
        writer.write(good[i : i + 16])
        await writer.drain()
    assert (await status_of(reader))[0] == 200
    writer.close()
    # The accepts queue in order: had either refused connection reached the
    # instance, it would be counted before the admitted one.
    await eventually(lambda: got.connections >= 1, what="the admitted connection")
    assert got.connections == 1
