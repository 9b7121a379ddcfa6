"""The door's answers over real sockets: a scripted server stands for the
instance (in the host's namespace, so no root is needed; the way into a
namespace is tested in test_entry.py) and writes each answer the way the
test says, piece by piece, waiting for the caller where it matters. Each
piece reaches the caller before the instance sends the next: a streamed
answer (chunked, until close, long), an answer with no body (204, 304, 1xx,
the answer to HEAD), pipelined answers, an answer cut short by the
instance, and the bytes after an upgrade. (A door that held small answers
until complete, to write each once, was measured and not kept:
docs/security.md, "The node's entry"; these are what such a door must not
break.)"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import pytest

from controlplane.nodeagent.entry.door import Door
from controlplane.runtime.leasetoken import LeaseKey

from .conftest import host_dial

NOW = 1_800_000_000_000
TIMEOUT = 5


class Entry:
    """A door whose instance is the test: each connection the door opens into
    it arrives on ``accepted``."""

    def __init__(self, key: LeaseKey, door: Door) -> None:
        self.key = key
        self.door = door
        self.accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        self.accepted = asyncio.Queue(maxsize=8)

    def request(self, method: str = "POST", extra: str = "") -> bytes:
        token = self.key.sign("inst-a", NOW + 60_000)
        body = "hi" if method == "POST" else ""
        return (
            f"{method} /x HTTP/1.1\r\nHost: x\r\nGalaxy-Lease: {token}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

    async def open(
        self, data: bytes
    ) -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
        """A caller's connection that sends data, and the instance's end of
        the connection the door opened for it (with data read off it)."""
        assert self.door._server is not None
        port = self.door._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        caller = socket.socket()
        caller.setblocking(False)
        await loop.sock_connect(caller, ("127.0.0.1", port))
        await loop.sock_sendall(caller, data)
        r, w = await asyncio.wait_for(self.accepted.get(), TIMEOUT)
        assert await asyncio.wait_for(r.readexactly(len(data)), TIMEOUT) == data
        return caller, r, w


@pytest.fixture
async def entry() -> AsyncIterator[Entry]:
    key = LeaseKey(os.urandom(32))
    box: list[Entry] = []

    async def accept(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await box[0].accepted.put((r, w))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    door = Door("inst-a", port, key, host_dial, clock_ms=lambda: NOW)
    box.append(Entry(key, door))
    await door.open("127.0.0.1", 0)
    yield box[0]
    await door.close()
    server.close()


async def recv(caller: socket.socket) -> bytes:
    """What one read of the caller's socket gets."""
    return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(caller, 1 << 20), TIMEOUT)


async def recv_exactly(caller: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        piece = await recv(caller)
        assert piece, got
        got += piece
    return got


HEAD = b"HTTP/1.1 200 OK\r\nServer: test\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"


@pytest.mark.parametrize("framing", ["chunked", "until-close", "longer"])
async def test_a_streamed_answer_is_not_held(entry: Entry, framing: str) -> None:
    """Its head reaches the caller before the instance sends any body, and
    each piece before the instance sends the next."""
    head = {
        "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        "until-close": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
        "longer": b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n",
    }[framing]
    pieces = {
        "chunked": [b"5\r\nhello\r\n", b"5\r\nworld\r\n", b"0\r\n\r\n"],
        "until-close": [b"data: 1\n\n", b"data: 2\n\n"],
        "longer": [b"x" * 524288, b"y" * 524288],
    }[framing]
    caller, _, w = await entry.open(entry.request())
    with caller:
        w.write(head)
        assert await recv_exactly(caller, len(head)) == head
        for piece in pieces:
            w.write(piece)
            assert await recv_exactly(caller, len(piece)) == piece
        if framing == "until-close":
            w.close()
            assert await recv(caller) == b""


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 204 No Content\r\nServer: test\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",  # a length, no body
        b"HTTP/1.1 100 Continue\r\n\r\n",
    ],
)
async def test_an_answer_without_a_body_is_not_held(entry: Entry, answer: bytes) -> None:
    caller, _, w = await entry.open(entry.request())
    with caller:
        w.write(answer)
        assert await recv_exactly(caller, len(answer)) == answer


async def test_the_answer_to_a_head_request_is_not_held(entry: Entry) -> None:
    """It declares a length and has no body; what comes after on the
    connection passes as it comes."""
    caller, r, w = await entry.open(entry.request("HEAD"))
    with caller:
        w.write(HEAD)
        assert await recv_exactly(caller, len(HEAD)) == HEAD
        request = entry.request()
        await asyncio.get_running_loop().sock_sendall(caller, request)
        assert await asyncio.wait_for(r.readexactly(len(request)), TIMEOUT) == request
        w.write(HEAD)
        assert await recv_exactly(caller, len(HEAD)) == HEAD
        w.write(b"hello")
        assert await recv_exactly(caller, 5) == b"hello"
    assert entry.accepted.empty()


async def test_pipelined_answers_are_not_held_behind_the_next_ones_head(entry: Entry) -> None:
    two = entry.request() + entry.request()
    caller, _, w = await entry.open(two)
    with caller:
        first = HEAD + b"hello"
        w.write(first + HEAD)  # the first answer whole, the second's head
        assert await recv_exactly(caller, len(first) + len(HEAD)) == first + HEAD
        w.write(b"world")
        assert await recv_exactly(caller, 5) == b"world"
        w.write(first + first)  # two whole answers in one write
        assert await recv_exactly(caller, 2 * len(first)) == first + first


async def test_an_instance_that_closes_mid_answer_hands_on_what_it_sent(entry: Entry) -> None:
    caller, _, w = await entry.open(entry.request())
    with caller:
        cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
        w.write(cut)
        w.close()
        assert await recv_exactly(caller, len(cut)) == cut
        assert await recv(caller) == b""


async def test_after_an_upgrade_bytes_pass_as_they_come(entry: Entry) -> None:
    upgrade = entry.request("GET", "Connection: Upgrade\r\nUpgrade: websocket\r\n")
    caller, r, w = await entry.open(upgrade)
    with caller:
        switching = (
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        )
        w.write(switching)
        assert await recv_exactly(caller, len(switching)) == switching
        # Raw bytes both ways; one that looks like a held answer's head too.
        w.write(HEAD)
        assert await recv_exactly(caller, len(HEAD)) == HEAD
        await asyncio.get_running_loop().sock_sendall(caller, b"\x81\x02hi")
        assert await asyncio.wait_for(r.readexactly(4), TIMEOUT) == b"\x81\x02hi"
