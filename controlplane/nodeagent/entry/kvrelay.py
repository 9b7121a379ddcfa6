"""The node's KV relay: how a prefill instance in a bubblewrap sandbox sends
a KV cache to its decode instance without a way out of its sandbox.

Each instance gets a directory of its own with one filesystem socket in it
(``SOCK_SEQPACKET``; the sandbox shows it read-only at ``SOCKET``, named by
``$GALAXY_KV_RELAY``). The instance sends one message: a JSON header (the
cache's id, tokens and size; the target; the decode instance's lease token
and id) and the cache's memfd (``SCM_RIGHTS``). The agent knows who sent it
by the socket it came on; ``kvroute.KvRoutes`` decides whether and where it
goes (same tenant, paired function, valid lease, bounded), and:

- **same node**: the descriptor is passed on to the decode instance's own
  message socket (``@galaxy-kvfd-<id>``, an abstract socket reached by
  making the socket in that instance's network namespace, ``setns``): no
  byte is copied. An agent that may not enter namespaces (``entry=factory``)
  PUTs the mapped pages to the decode instance's entry instead.
- **another node**: the mapped pages are PUT to the decode instance's entry
  there (``http://HOST:PORT/v1/kv/ID`` with the lease token), which admits
  them as any request.

The receiver's answer goes back to the sender unchanged (201, or its
refusal), or the relay's own refusal: 400-404 naming the field, 429 when
the node has too many transfers or bytes in flight, 504 past the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controlplane.nodeagent.entry.kvroute import KvRoutes, Member, Refused, Transfer
from controlplane.runtime import kvaddr, kvmove

log = logging.getLogger(__name__)

#: where the socket is inside the sandbox (a directory of its own, read-only;
#: under /dev, as /dev/log, since the escape suite allows no new top-level
#: directory)
DIRECTORY = "/dev/galaxy-kv"
SOCKET = f"{DIRECTORY}/kv.sock"
ENV = "GALAXY_KV_RELAY"
_NAME = "kv.sock"
#: a sender has this long to send its one message once connected
_HEADER_TIMEOUT_S = 5.0
#: connections one instance may hold open at once (more are closed at once:
#: the node's transfers are bounded by KvRoutes, the agent's tasks by this)
MAX_CONNECTIONS = 16

#: makes a non-blocking AF_UNIX SOCK_SEQPACKET socket in an instance's
#: network namespace (None: the agent cannot enter it)
UnixDial = Callable[[], socket.socket]


@dataclass
class _Listener:
    sock: socket.socket
    directory: Path
    dial: UnixDial | None
    open_connections: int = 0


class KvRelay:
    """The relay of one node agent's instances (see the module docstring)."""

    def __init__(self, routes: KvRoutes) -> None:
        self.routes = routes
        self._listeners: dict[str, _Listener] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def prepare(self, directory: Path, owner: tuple[int, int] | None) -> None:
        """Make an instance's relay directory (mode 0700, the instance's
        own: no other user of the host reaches its socket) before its
        sandbox shows it."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(mode=0o700)
        if owner is not None:
            os.chown(directory, *owner)

    def open(self, member: Member, directory: Path, dial: UnixDial | None) -> None:
        """Listen for member's transfers on its directory's socket (owned
        by the directory's owner); dial: how to reach its own KV socket as a
        receiver."""
        self.close(member.instance_id)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Through the directory's descriptor: a socket path is limited to
        # 108 bytes, an instance's directory may be longer.
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sock.bind(f"/proc/self/fd/{fd}/{_NAME}")
            st = os.stat(directory)
            os.chown(directory / _NAME, st.st_uid, st.st_gid)
            os.chmod(directory / _NAME, 0o600)
        except OSError:
            sock.close()
            raise
        finally:
            os.close(fd)
        sock.listen(16)
        sock.setblocking(False)
        self.routes.join(member)
        self._listeners[member.instance_id] = _Listener(sock, directory, dial)
        loop.add_reader(sock.fileno(), self._accept, sock, member.instance_id)

    def close(self, instance_id: str) -> None:
        """Stop an instance's relay and remove its directory."""
        self.routes.leave(instance_id)
        got = self._listeners.pop(instance_id, None)
        if got is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: closing at exit
            asyncio.get_running_loop().remove_reader(got.sock.fileno())
        got.sock.close()
        shutil.rmtree(got.directory, ignore_errors=True)

    def _accept(self, sock: socket.socket, sender: str) -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        got = self._listeners.get(sender)
        if got is None or got.open_connections >= MAX_CONNECTIONS:
            conn.close()
            return
        got.open_connections += 1
        conn.setblocking(False)
        task = asyncio.get_running_loop().create_task(self._serve(conn, sender, got))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket, sender: str, listener: _Listener) -> None:
        fds: list[int] = []
        try:
            async with asyncio.timeout(_HEADER_TIMEOUT_S):
                header, fds = await _receive(conn)
            status, message = await self._carry(sender, header, fds)
            conn.send(kvmove.answer(status, message))
        except (OSError, TimeoutError):
            pass  # the sender went away or said nothing: nothing was admitted
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()
            listener.open_connections -= 1

    async def _carry(self, sender: str, header: bytes, fds: list[int]) -> tuple[int, str]:
        # aiohttp is imported by the first transfer, not by every agent's start
        # (~90 ms of CPU, its TLS context included; most nodes move no KV).
        import aiohttp

        if len(fds) != 1:
            return 400, "KV relay: one header and one descriptor"
        try:
            t = self.routes.admit(sender, header)
        except Refused as e:
            log.info("KV relay: refused a transfer of %s: %s %s", sender, e.status, e.message)
            return e.status, e.message
        try:
            async with asyncio.timeout(t.timeout_s):
                return await self._forward(t, fds[0])
        except TimeoutError:
            return 504, f"KV relay: the transfer took longer than {t.timeout_s:g} s"
        except (OSError, aiohttp.ClientError) as e:
            return 502, f"KV relay: the receiver cannot be reached: {e}"[:300]
        except ValueError as e:
            return 400, f"KV relay: {e}"
        finally:
            self.routes.done(t)

    async def _forward(self, t: Transfer, fd: int) -> tuple[int, str]:
        url = t.url
        if t.local is not None:
            got = self._listeners.get(t.local.instance_id)
            if got is not None and got.dial is not None:
                path = kvaddr.unix_path(kvaddr.shm_target(t.local.instance_id))
                return await kvmove.hand_over(got.dial(), path, t.header(), fd, t.timeout_s)
            url = f"http://{t.local.address}/v1/kv/{t.kv_id}"
        import aiohttp

        data = kvmove.mapped(fd, t.size)
        try:
            timeout = aiohttp.ClientTimeout(total=t.timeout_s, sock_connect=5)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                return await kvmove.put(s, url, t.size, t.tokens, kvmove.slices(data), t.lease)
        finally:
            with contextlib.suppress(BufferError):  # a view left by a cut stream: GC frees it
                data.close()

    async def close_all(self) -> None:
        """Stop every relay and wait for transfers under way to end."""
        for instance_id in list(self._listeners):
            self.close(instance_id)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors, waiting for it to come."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            header, fds, _flags, _addr = socket.recv_fds(conn, kvmove.MAX_HEADER + 1, 2)
            return header, fds
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(conn.fileno(), _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def bwrap_args(directory: Path) -> list[str]:
    """bwrap arguments that show an instance's KV relay directory (its
    socket to this relay) read-only at ``DIRECTORY``: a prefill instance's
    one way to send a cache."""
    return ["--dir", os.path.dirname(DIRECTORY), "--ro-bind", str(directory), DIRECTORY]
