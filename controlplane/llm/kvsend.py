"""Sending a KV cache to a decode instance's inbox: one sender, the
transport chosen by the target and by where the sender runs.

- ``Http`` (``http://HOST:PORT``, ``unix:/path``, ``unix:@name``): ``PUT
  /v1/kv/ID`` (``kvwire``'s receiver), with the lease token for a node's
  entry.
- ``Descriptor`` to the receiver (``shm:@name``, same node): the cache
  written once into a memfd whose descriptor is passed over the decode
  instance's message socket (``kvshm``'s receiver).
- ``Descriptor`` to the node's KV relay (any target, when
  ``$GALAXY_KV_RELAY`` names one): a sender in a bubblewrap sandbox has a
  network namespace of its own and no egress, so neither of the above
  reaches its peer; the node agent gives it a filesystem socket instead
  (``controlplane.nodeagent.entry.kvrelay``), and the header says where the
  cache goes and with which lease. The relay checks both, then passes the
  descriptor on (same node) or streams the mapped pages to the other node's
  entry (another node).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from controlplane.llm.kvwire import CHUNK, pattern
from controlplane.runtime import kvmove
from controlplane.runtime.kvaddr import unix_path

#: the instance's environment variable naming its node's KV relay socket
RELAY_ENV = "GALAXY_KV_RELAY"


@dataclass(frozen=True)
class Cache:
    """One cache to send: the real bytes, or nbytes of ``fill`` (emulated)."""

    kv_id: str
    nbytes: int
    tokens: int
    data: bytes | None = None
    fill: bytes = b"\x5a"


class Transport(Protocol):
    """How a cache gets to its receiver."""

    async def move(self, cache: Cache, timeout_s: float) -> tuple[int, str]:
        """Send it: the receiver's (status, message); 201 when it took it."""
        ...


async def _chunks(nbytes: int, fill: bytes) -> AsyncIterator[bytes]:
    """nbytes of a repeated pattern, CHUNK at a time (one buffer, sliced)."""
    block = pattern(fill)
    view = memoryview(block)
    left = nbytes
    while left > 0:
        n = min(left, CHUNK)
        yield view[:n].tobytes() if n < CHUNK else block
        left -= n


@dataclass(frozen=True)
class Http:
    """``PUT /v1/kv/ID`` over TCP or a Unix socket."""

    target: str
    lease: str = ""

    async def move(self, cache: Cache, timeout_s: float) -> tuple[int, str]:
        if self.target.startswith("unix:"):
            connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=unix_path(self.target))
            url = f"http://localhost/v1/kv/{cache.kv_id}"
        else:
            connector = aiohttp.TCPConnector()
            url = f"{self.target.rstrip('/')}/v1/kv/{cache.kv_id}"
        body = kvmove.slices(cache.data) if cache.data else _chunks(cache.nbytes, cache.fill)
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=5)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
            return await kvmove.put(s, url, cache.nbytes, cache.tokens, body, self.lease)


def _fill(fd: int, cache: Cache) -> None:
    """Write the cache into the memfd (a worker thread: a copy of its size).
    ``pwrite`` rather than stores into a mapping: the kernel allocates the
    file's pages as it copies, without a page fault per page."""
    nbytes = cache.nbytes
    if cache.data is not None:
        view = memoryview(cache.data)
        for at in range(0, nbytes, CHUNK):
            os.pwrite(fd, view[at : at + CHUNK], at)
        return
    block = pattern(cache.fill)
    for at in range(0, nbytes, CHUNK):
        os.pwrite(fd, block[: min(CHUNK, nbytes - at)], at)


@dataclass(frozen=True)
class Descriptor:
    """The cache in a memfd, its descriptor passed over the message socket
    at ``path``; ``route``: what a relay needs besides (where the cache
    goes, the lease), empty when path is the receiver's own socket."""

    path: str
    route: dict[str, object] = field(default_factory=dict)

    async def move(self, cache: Cache, timeout_s: float) -> tuple[int, str]:
        fd = os.memfd_create(f"galaxy-kv-{cache.kv_id}", os.MFD_CLOEXEC)
        try:
            await asyncio.to_thread(_fill, fd, cache)
            head = {"kv_id": cache.kv_id, "tokens": cache.tokens, "size": cache.nbytes}
            if self.route:
                head |= self.route | {"timeout_s": timeout_s}
            return await kvmove.hand_over(kvmove.seqpacket(), self.path, head, fd, timeout_s)
        finally:
            os.close(fd)


def transport(
    target: str, lease: str = "", instance: str = "", relay: str | None = None
) -> Transport:
    """The transport to target (see the module docstring); relay: the
    node's relay socket (None: ``$GALAXY_KV_RELAY``, unset outside a
    bubblewrap sandbox)."""
    if relay is None:
        relay = os.environ.get(RELAY_ENV, "")
    if relay:
        return Descriptor(relay, {"target": target, "lease": lease, "instance": instance})
    if target.startswith("shm:"):
        return Descriptor(unix_path(target))
    return Http(target, lease)


async def send(
    target: str,
    kv_id: str,
    nbytes: int,
    tokens: int,
    *,
    fill: bytes = b"\x5a",
    data: bytes | None = None,
    timeout_s: float = 120.0,
    lease: str = "",
    instance: str = "",
    relay: str | None = None,
) -> float:
    """Send a cache to target (``http://HOST:PORT``, ``unix:/path``,
    ``unix:@name`` or ``shm:@name``): the real bytes ``data`` (nbytes must
    be their length), or else an emulated cache of nbytes of ``fill``; the
    seconds it took (writing a memfd included). ``lease``: the decode
    instance's lease token (for a node's entry); ``instance``: its id (what
    a relay checks the lease against). RuntimeError with the receiver's
    message when it refuses; OSError or TimeoutError when it cannot be
    reached in time."""
    if data is not None and len(data) != nbytes:
        raise ValueError(f"nbytes: {nbytes}, but the cache has {len(data)} bytes")
    way = transport(target, lease, instance, relay)
    t0 = time.perf_counter()
    status, message = await way.move(Cache(kv_id, nbytes, tokens, data, fill), timeout_s)
    if status != 201:
        raise RuntimeError(f"KV transfer to {target} refused: {status} {message}")
    return time.perf_counter() - t0
