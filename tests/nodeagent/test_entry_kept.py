"""The door on a kept connection, over real sockets: an aiohttp server stands
for the instance (in the host's namespace, so no root is needed; the way
into a namespace is tested in test_entry.py), the door's clock is injected.
Each request of a connection is admitted by the token it shows: the lease
admitted on the first request does not carry a later request in once it
has ended, nor one that shows another token."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from controlplane.nodeagent.entry.door import Door
from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey

from .conftest import host_dial, stand_in

NOW = 1_800_000_000_000
END = NOW + 60_000


class Entry:
    """A door in front of a real HTTP server, with a clock the test moves."""

    def __init__(self, key: LeaseKey, door: Door) -> None:
        self.key = key
        self.door = door
        self.now = NOW
        self.seen = 0  # requests that reached the server

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self.door._server is not None
        port = self.door._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return await asyncio.open_connection("127.0.0.1", port)


@pytest.fixture
async def entry() -> AsyncIterator[Entry]:
    key = LeaseKey(os.urandom(32))
    box: list[Entry] = []

    def seen() -> None:
        box[0].seen += 1

    async with stand_in(seen) as port:
        door = Door("inst-a", port, key, host_dial, clock_ms=lambda: box[0].now)
        box.append(Entry(key, door))
        await door.open("127.0.0.1", 0)
        yield box[0]
        await door.close()


def _request(token: str, body: str = "hi") -> bytes:
    return (
        f"POST /echo HTTP/1.1\r\nHost: x\r\nGalaxy-Lease: {token}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return int(head.split()[1]), await asyncio.wait_for(reader.readexactly(length), 5)


async def test_a_kept_lease_stops_opening_the_door_when_it_ends(entry: Entry) -> None:
    reader, writer = await entry.connect()
    token = entry.key.sign("inst-a", END)
    try:
        for i in range(3):
            writer.write(_request(token, f"r{i}"))
            assert await _answer(reader) == (200, f"r{i}".encode())
        entry.now = END + SKEW_MS + 1
        writer.write(_request(token, "late"))
        status, body = await _answer(reader)
        assert status == 401 and b"ended" in body, body
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the door
    finally:
        writer.close()
    assert entry.seen == 3


@pytest.mark.parametrize("other", ["inst-b", "forged", "none"])
async def test_a_kept_connection_refuses_a_request_with_another_token(
    entry: Entry, other: str
) -> None:
    reader, writer = await entry.connect()
    token = entry.key.sign("inst-a", END)
    shown = {
        "inst-b": entry.key.sign("inst-b", END),
        "forged": token[:-4] + "AAAA",
        "none": "",
    }[other]
    try:
        for _ in range(2):  # admitted, then admitted as the kept lease
            writer.write(_request(token))
            assert (await _answer(reader))[0] == 200
        writer.write(_request(shown))
        status, _ = await _answer(reader)
        assert status == (401 if other == "none" else 403)
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    assert entry.seen == 2


async def test_a_refused_request_pipelined_behind_an_admitted_one_does_not_pass(
    entry: Entry,
) -> None:
    """Both requests in one write: the second's token is checked although
    the first's was just admitted on this connection."""
    reader, writer = await entry.connect()
    try:
        writer.write(
            _request(entry.key.sign("inst-a", END)) + _request(entry.key.sign("inst-b", END))
        )
        status, _ = await _answer(reader)
        assert status == 403
    finally:
        writer.close()
    assert entry.seen == 0
