"""The agent's side of the socket factory (``sockfactory``): TCP sockets
made in an instance's network namespace, fetched in batches over the Unix
socket the factory listens on in the instance's private directory.

Used instead of ``netns.NetnsDialer`` by an agent that may not enter other
namespaces. A socket costs one round trip over the Unix socket per
``batch`` connections; the bytes of a request then go straight over the
namespace's loopback, as with ``setns``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket

from controlplane.nodeagent.entry import sockfactory

_TIMEOUT_S = 2.0


class FactoryDialer:
    """Makes TCP sockets in an instance's network namespace by asking the
    factory listening in directory (the instance's private directory).
    batch: sockets fetched per round trip (1-64; the ones not used yet wait
    in a pool, as unconnected sockets)."""

    def __init__(self, directory: str, batch: int = 8) -> None:
        if not 1 <= batch <= 64:
            raise ValueError(f"batch: 1 to 64 sockets, got {batch}")
        # Reached through the directory's descriptor: a Unix socket's path
        # is limited to 108 bytes, an instance's directory may be longer.
        self._dir = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.path = f"/proc/self/fd/{self._dir}/{sockfactory.NAME}"
        self.batch = batch
        self._pool: collections.deque[socket.socket] = collections.deque()
        self._conn: socket.socket | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def socket(self) -> socket.socket:
        """A new non-blocking TCP socket in the instance's namespace; OSError
        when the factory cannot be reached (not started yet, or gone)."""
        while not self._pool:
            async with self._lock:
                if not self._pool:
                    await self._fill()
        return self._pool.popleft()

    async def _fill(self) -> None:
        if self._closed:
            raise ConnectionError("the instance's entry is closed")
        loop = asyncio.get_running_loop()
        if self._conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            try:
                await loop.sock_connect(conn, self.path)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        conn = self._conn
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                await loop.sock_sendall(conn, bytes([self.batch]))
                fds = await _recv_fds(loop, conn, self.batch)
        except BaseException:
            self._drop()
            raise
        for fd in fds:
            s = socket.socket(fileno=fd)
            # What comes back is checked: a function that replaced the
            # factory could pass any descriptor it holds.
            if s.family != socket.AF_INET or s.type != socket.SOCK_STREAM:
                s.close()
                continue
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pool.append(s)
        if not self._pool:
            self._drop()
            raise ConnectionError("the instance's socket factory sent no usable socket")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the pool and the connection to the factory."""
        self._closed = True
        self._drop()
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1
        while self._pool:
            self._pool.popleft().close()


async def _recv_fds(loop: asyncio.AbstractEventLoop, conn: socket.socket, most: int) -> list[int]:
    """The descriptors of one factory answer (waiting until it comes)."""
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1, most)
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(conn.fileno(), _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())
            continue
        if not msg:
            for fd in fds:
                socket.close(fd)
            raise ConnectionError("the instance's socket factory closed its connection")
        return fds


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
