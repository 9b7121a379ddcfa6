"""The two wires a KV cache moves on, shared by the instances that send
caches (``controlplane.llm.kvsend``) and the node agent's KV relay
(``controlplane.nodeagent.entry.kvrelay``), which forwards them.

- **A descriptor** (same node): the cache sits in a memfd; one
  ``SOCK_SEQPACKET`` message carries a JSON header and the descriptor
  (``SCM_RIGHTS``), and the answer is one message ``{status, message}``.
  No byte of the cache crosses the socket.
- **HTTP** (``PUT /v1/kv/ID``, another node, or where no descriptor can
  go): the bytes stream in chunks with ``Content-Length`` and
  ``X-Galaxy-KV-Tokens``, and the lease token for a node's entry.

Both have a deadline; both report a refusal as (status, message) rather
than raising, so a relay can pass the receiver's answer back unchanged.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from controlplane.runtime import leasetoken

if TYPE_CHECKING:
    import aiohttp

#: a header is small; anything longer is refused
MAX_HEADER = 2048
CHUNK = 1 << 20


def answer(status: int, message: str) -> bytes:
    """A descriptor hand-over's answer message."""
    return json.dumps({"status": status, "message": message[:300]}).encode()


def read_answer(reply: bytes) -> tuple[int, str]:
    """(status, message) of an answer; 502 when it is not one."""
    try:
        got = json.loads(reply)
        return int(got["status"]), str(got["message"])
    except (ValueError, KeyError, TypeError):
        return 502, "no answer"


async def hand_over(
    sock: socket.socket, path: str, header: dict[str, object], fd: int, timeout_s: float
) -> tuple[int, str]:
    """Connect sock (a new non-blocking ``AF_UNIX SOCK_SEQPACKET`` socket,
    closed here) to path, pass header and the descriptor fd, and return the
    receiver's (status, message)."""
    loop = asyncio.get_running_loop()
    with sock:
        sock.setblocking(False)
        async with asyncio.timeout(timeout_s):
            await loop.sock_connect(sock, path)
            # One small message: it never blocks.
            socket.send_fds(sock, [json.dumps(header).encode()], [fd])
            reply = await loop.sock_recv(sock, 4096)
    return read_answer(reply)


def seqpacket() -> socket.socket:
    """A new Unix message socket, as ``hand_over`` takes."""
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


async def slices(data: bytes | bytearray | mmap.mmap) -> AsyncIterator[memoryview]:
    """A cache, CHUNK at a time (views: no copy of the whole)."""
    view = memoryview(data)
    for at in range(0, len(view), CHUNK):
        yield view[at : at + CHUNK]


async def put(
    session: aiohttp.ClientSession,
    url: str,
    nbytes: int,
    tokens: int,
    body: AsyncIterator[bytes | memoryview],
    lease: str = "",
) -> tuple[int, str]:
    """PUT a cache of nbytes to url (``.../v1/kv/ID``) within the session's
    deadline; (status, the receiver's text when it refused)."""
    headers = {"X-Galaxy-KV-Tokens": str(tokens), "Content-Length": str(nbytes),
               "Content-Type": "application/octet-stream"}  # fmt: skip
    if lease:
        headers[leasetoken.HEADER] = lease
    async with session.put(url, data=body, headers=headers) as resp:
        text = "" if resp.status == 201 else (await resp.text())[:300]
        return resp.status, text


def mapped(fd: int, size: int) -> mmap.mmap:
    """The first size bytes of a cache's memfd, read-only (ValueError when
    the file is shorter)."""
    if os.fstat(fd).st_size < size:
        raise ValueError(f"the file holds fewer than {size} bytes")
    return mmap.mmap(fd, size, prot=mmap.PROT_READ)
