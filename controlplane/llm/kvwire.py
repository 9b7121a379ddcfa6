"""Moving a KV cache from a prefill instance to a decode instance over HTTP.

The sender ``PUT``s the bytes to ``/v1/kv/ID`` on the decode instance (TCP
to another host, or the decode instance's Unix socket on the same node:
``unix:/path/to.sock``); the receiver keeps them in a bounded ``KvInbox``
until a decode request names ``galaxy_kv_id: ID``. HTTP because both sides
already speak it (aiohttp streams a body of any size in chunks, no copy of
the whole cache on either side) and a proxy or a capture tool understands it.
``DELETE /v1/kv/ID`` gives a cache's room back (its request was cancelled).

Same node, inside Galaxy: every instance also listens on the abstract Unix
socket ``@galaxy-kv-<instance id>`` (``controlplane.runtime.kvaddr``); the
gateway names it as the target when it paired two instances on one node.

Headers: ``X-Galaxy-KV-Tokens`` (the prompt tokens the cache covers) and
``Content-Length`` (required: the receiver reserves room before it reads).
A cache that does not fit the inbox is refused with 413 before a byte is
read; an entry not claimed within its TTL is dropped. The sender, over this
path or the others, is ``controlplane.llm.kvsend``.
"""

from __future__ import annotations

import mmap
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from controlplane.llm.errors import BadRequest
from controlplane.runtime.kvaddr import (
    MAX_ID,
    local_target,
    shm_target,
    unix_path,
    valid_id,
    valid_target,
)
from controlplane.runtime.kvmove import CHUNK

__all__ = ["MAX_ID", "local_target", "shm_target", "unix_path", "valid_id", "valid_target"]


async def listen_local(
    runner: web.AppRunner, kv_unix: str, instance_id: str, inbox: KvInbox
) -> Callable[[], None]:
    """Serve runner's application on the Unix sockets of same-node KV
    transfers: ``kv_unix`` (a path, when given) and, inside Galaxy (an
    instance id), the instance's abstract sockets: HTTP and shared memory
    (``kvshm``, into ``inbox``). Returns what stops the shared-memory one
    (the others close with the runner)."""
    if kv_unix:
        await web.UnixSite(runner, kv_unix).start()
    if not instance_id or not valid_id(instance_id):
        return lambda: None
    from controlplane.llm import kvshm  # (it builds on this module)

    await web.UnixSite(runner, unix_path(local_target(instance_id))).start()
    sock = await kvshm.listen(inbox, shm_target(instance_id))
    return lambda: kvshm.stop(sock)


class InboxFull(Exception):
    """No room for a cache of this size (the sender answers 413)."""


@dataclass
class KvEntry:
    """One received cache."""

    kv_id: str
    tokens: int
    #: bytes reserved (the Content-Length)
    size: int
    #: the bytes: read from a socket, or mapped from shared memory (kvshm)
    data: bytearray | mmap.mmap
    arrived: float
    complete: bool = False


@dataclass
class KvInbox:
    """Received caches waiting for their decode request (pure, bounded).

    At most ``max_bytes`` and ``max_entries`` held (reserved at the start of
    a transfer, so concurrent transfers cannot overshoot); entries older than
    ``ttl_s`` are dropped by ``expire``.
    """

    max_bytes: int
    max_entries: int = 1024
    ttl_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    entries: OrderedDict[str, KvEntry] = field(default_factory=OrderedDict)
    held: int = 0

    def reserve(self, kv_id: str, nbytes: int, tokens: int) -> KvEntry:
        """Room for a cache about to arrive (InboxFull when there is none,
        ValueError for a duplicate id)."""
        self.expire()
        if kv_id in self.entries:
            raise ValueError(f"KV id {kv_id!r} is already here")
        if nbytes > self.max_bytes - self.held or len(self.entries) >= self.max_entries:
            raise InboxFull(
                f"{nbytes} bytes do not fit: {self.held} of {self.max_bytes} held in "
                f"{len(self.entries)} caches"
            )
        e = KvEntry(kv_id, tokens, nbytes, bytearray(), self.clock())
        self.entries[kv_id] = e
        self.held += nbytes
        return e

    def drop(self, kv_id: str) -> None:
        """Give back a reservation (a transfer that failed)."""
        e = self.entries.pop(kv_id, None)
        if e is not None:
            self.held -= e.size

    def take(self, kv_id: str) -> KvEntry | None:
        """The complete cache with this id, removed from the inbox; None if
        it is not here (never sent, still arriving, expired, or taken)."""
        self.expire()
        e = self.entries.get(kv_id)
        if e is None or not e.complete:
            return None
        del self.entries[kv_id]
        self.held -= e.size
        return e

    def expire(self) -> None:
        """Drop entries older than the TTL (oldest first)."""
        limit = self.clock() - self.ttl_s
        while self.entries:
            e = next(iter(self.entries.values()))
            if e.arrived >= limit:
                break
            del self.entries[e.kv_id]
            self.held -= e.size


def claim(inbox: KvInbox, kv_id: object) -> KvEntry:
    """The cache a decode request names in ``galaxy_kv_id``, taken from the
    inbox; BadRequest naming the field when the id is malformed or the cache
    is not here."""
    if not isinstance(kv_id, str) or not valid_id(kv_id):
        raise BadRequest("galaxy_kv_id: 1-64 of A-Z, a-z, 0-9, '-', '_'")
    entry = inbox.take(kv_id)
    if entry is None:
        raise BadRequest(
            "galaxy_kv_id: no KV cache with this id here (never sent to this "
            "instance, still arriving, expired, or already used)"
        )
    return entry


def receiver(inbox: KvInbox) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler of ``PUT /v1/kv/{kv_id}``."""

    async def put(request: web.Request) -> web.Response:
        kv_id = request.match_info["kv_id"]
        if not valid_id(kv_id):
            return _refuse(400, "kv id: 1-64 of A-Z, a-z, 0-9, '-', '_'")
        size = request.content_length
        if size is None:
            return _refuse(411, "Content-Length: required (the inbox reserves room first)")
        try:
            tokens = int(request.headers.get("X-Galaxy-KV-Tokens", ""))
        except ValueError:
            return _refuse(400, "X-Galaxy-KV-Tokens: an integer")
        if tokens < 1:
            return _refuse(400, "X-Galaxy-KV-Tokens: at least 1")
        try:
            entry = inbox.reserve(kv_id, size, tokens)
        except InboxFull as e:
            return _refuse(413, f"KV inbox full: {e}")
        except ValueError as e:
            return _refuse(409, str(e))
        # One buffer of the reserved size, filled in place: appending would
        # reallocate and hold up to twice the cache while it grows.
        data = bytearray(size)
        entry.data = data
        pos = 0
        try:
            async for chunk in request.content.iter_chunked(CHUNK):
                if pos + len(chunk) > size:
                    raise ValueError("more bytes than Content-Length")
                data[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
            if pos != size:
                raise ValueError(f"{pos} of {size} bytes arrived")
        except (ValueError, aiohttp.ClientError, ConnectionError) as e:
            inbox.drop(kv_id)
            return _refuse(400, f"KV transfer: {e}")
        entry.complete = True
        return web.json_response({"kv_id": kv_id, "bytes": size, "tokens": tokens}, status=201)

    return put


def remover(inbox: KvInbox) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler of ``DELETE /v1/kv/{kv_id}``: a cache that will
    not be used (its request was cancelled) gives its room back at once."""

    async def delete(request: web.Request) -> web.Response:
        kv_id = request.match_info["kv_id"]
        if not valid_id(kv_id) or kv_id not in inbox.entries:
            return _refuse(404, "no KV cache with this id here")
        inbox.drop(kv_id)
        return web.Response(status=204)

    return delete


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def pattern(fill: bytes) -> bytes:
    """CHUNK bytes of ``fill`` repeated: an emulated cache's contents."""
    return (fill * (CHUNK // len(fill) + 1))[:CHUNK]
