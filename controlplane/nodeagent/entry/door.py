"""An instance's door: the entry's listener for one instance.

Every HTTP/1.1 request arriving on it must carry a ``Galaxy-Lease`` token
Dispatch signed for this instance (``controlplane.runtime.leasetoken``); a
request without one, with a forged, expired or another instance's token gets
401 or 403 with the reason and the connection is closed, and nothing of it
reaches the instance as a whole request. Until a connection's first
request is admitted, nothing of it reaches the instance at all, not even a
connection (a first head split across reads is held until whole, at most
``MAX_HEAD_BYTES``); on a kept connection, the first bytes of a later head
that arrives split go on before the rest shows its token, and the
connection is cut if it is refused. An admitted connection is connected
into the instance's network namespace and its bytes flow both ways unchanged: the
door parses requests (to check each one's header; on a kept connection a
token already admitted costs no new HMAC until its lease ends, ``admission``)
but never rewrites them, and does not parse answers. After a protocol
upgrade (WebSocket) the rest of the connection is raw bytes, its opening
request having been checked.

A route request (a first request with a ``Galaxy-Route`` header and no
other use) is answered by the door itself: with a route token for the
caller's next source port, made with the cluster's route key (the
gateway's), the agent routes that connection straight to the instance
(``routing``) and the door says 204; nothing of it reaches the instance.

Bounds (``EntryLimits``, shared by every door of an agent): connections
open at once (beyond: 503 and closed), and the time a new connection has to
show its first admitted request head (beyond: 408 and closed), so that
callers without a lease cannot hold the agent's file descriptors.

Metrics (the agent's ``/metrics``): connections accepted and open, and the
requests refused by reason (``REFUSED``), over every door of the agent.

Extension points (docs/security.md, "The node's entry"): ``_Client.
on_headers_complete`` sees every admitted request of an instance (per-
instance concurrency, load signals, batching would hook there), and
``Door.close`` is where a drain would wait for open requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import cast

import httptools  # type: ignore[import-not-found,unused-ignore]
from prometheus_client import Counter, Gauge

from controlplane.nodeagent.entry.admission import Admission
from controlplane.nodeagent.entry.limits import EntryLimits
from controlplane.nodeagent.entry.routing import ROUTED
from controlplane.runtime.leasetoken import ROUTE_HEADER, LeaseKey, Verdict

log = logging.getLogger(__name__)

#: Makes a new non-blocking TCP socket in an instance's network namespace.
Dial = Callable[[], Awaitable[socket.socket]]

_LEASE = b"galaxy-lease"
_LEASE_LEN = len(_LEASE)
# A route request's header, ``Galaxy-Route: SOURCE_PORT:TOKEN`` (``routing``):
# as long as the lease's, so one length test serves both.
_ROUTE = ROUTE_HEADER.lower().encode()
#: Bytes a connection may send before its first request is admitted.
MAX_HEAD_BYTES = 64 * 1024
_REASONS = {
    400: "Bad Request",
    404: "Not Found",
    401: "Unauthorized",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


CONNECTIONS = Counter(
    "galaxy_entry_connections_total", "Connections callers opened to instances' doors"
)
OPEN = Gauge("galaxy_entry_open_connections", "Connections open at instances' doors")
#: Why a door refuses a request: a lease verdict's name (401/403), not an
#: HTTP/1.1 request (400), the instance not accepting the connection (502),
#: no admitted head in time (408), a first head too long (431), the agent's
#: doors full (503).
REFUSALS = (
    *(v.name.lower() for v in Verdict if v is not Verdict.OK),
    "bad_request",
    "unreachable",
    "head_timeout",
    "head_too_large",
    "full",
)
REFUSED = Counter(
    "galaxy_entry_refused_total",
    "Requests instances' doors refused (nothing of them reached the instance), by reason",
    ["reason"],
)
for _reason in REFUSALS:
    REFUSED.labels(_reason)  # every reason's series from the start, at 0


_ROUTED = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
#: Why a route token is refused, by verdict.
_ROUTE_REFUSED = {
    Verdict.MISSING: "Galaxy-Route: SOURCE_PORT:TOKEN",
    Verdict.MALFORMED: "Galaxy-Route: SOURCE_PORT:TOKEN",
    Verdict.EXPIRED: "the route token has ended: make a new one",
    Verdict.FORGED: "Galaxy-Route was not made for this port and source port",
}


def _answer(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    extra = {
        401: b'WWW-Authenticate: Galaxy-Lease realm="galaxy"\r\n',
        503: b"Retry-After: 1\r\n",
    }.get(status, b"")
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    return head + extra + b"\r\n" + body


class _Upstream(asyncio.Protocol):
    """The door's connection into the instance: answers go back as they come."""

    def __init__(self, client: _Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def eof_received(self) -> bool:
        if self.client.transport.can_write_eof():
            self.client.transport.write_eof()
        self.client.half_closed()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()

    def pause_writing(self) -> None:
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class _Client(asyncio.Protocol):
    """One caller's connection to the door."""

    transport: asyncio.Transport

    def __init__(self, door: Door) -> None:
        self.door = door
        self.parser = httptools.HttpRequestParser(self)
        self.admission = Admission(door.key, door.instance_id)
        self.lease: bytes | None = None
        self.refused: Verdict | None = None
        self.raw = False  # after an upgrade: no more requests to check
        self.up: asyncio.Transport | None = None
        self.pending: list[bytes] | None = None  # while connecting upstream
        self.connecting: asyncio.Task[None] | None = None
        #: the caller ended its side while the instance was being connected
        self.eof_pending = False
        #: directions ended (the caller's, the instance's): at 2, both close
        self.ended = 0
        #: closes the connection unless a request is admitted first
        self.timer: asyncio.TimerHandle | None = None
        #: refused at once: the agent's doors were full
        self.over = False
        #: what came before the first admitted request (None: one was)
        self.early: list[bytes] | None = []
        self.early_bytes = 0
        self.admitted = False
        self.route: bytes | None = None  # a route request's header
        self.answer: bytes | None = None  # the door's own answer to it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have Transport's methods, not its class.
        self.transport = cast(asyncio.Transport, transport)
        CONNECTIONS.inc()
        limits = self.door.limits
        if limits.open >= limits.max_connections:
            self.over = True
            self._refuse(503, f"{limits.max_connections} connections open at this node", "full")
            return
        limits.open += 1
        OPEN.inc()
        self.door.clients.add(self)
        self.timer = asyncio.get_running_loop().call_later(limits.head_s, self._slow)

    def _slow(self) -> None:
        self.timer = None
        self._refuse(
            408, f"no admitted request within {self.door.limits.head_s:g}s", "head_timeout"
        )

    # httptools callbacks, called during feed_data (no on_message_begin:
    # each callback is a Python call per request).
    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header of every request: the length test spares
        # a lower-cased copy of each name that cannot be the lease's.
        if len(name) == _LEASE_LEN:
            low = name.lower()
            if low == _LEASE:
                self.lease = value
            elif low == _ROUTE:
                self.route = value

    def on_headers_complete(self) -> None:
        if self.route is not None:
            # Answered by the door, never passed on: only as a connection's
            # first request (a later one's first bytes may have gone on).
            if self.early is None or self.admitted:
                self.refused = Verdict.MALFORMED
            else:
                self.answer = self.door.route_request(self.route, self.transport)
            self.route = None
            return
        verdict = self.admission.verdict(self.lease, self.door.clock_ms())
        self.lease = None  # the next request shows its own
        if verdict is not Verdict.OK:
            if self.refused is None:
                self.refused = verdict
        elif self.timer is not None:
            self.timer.cancel()  # admitted: the instance's server governs it now
            self.timer = None
            self.admitted = True

    def data_received(self, data: bytes) -> None:
        if not self.raw:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.raw = True  # the upgrading request's headers were checked
            except httptools.HttpParserError:
                self._refuse(400, "not an HTTP/1.1 request", "bad_request")
                return
            if self.answer is not None:
                self.transport.write(self.answer)
                self.transport.close()
                return
            if self.refused is not None:
                # Nothing of a connection that shows a bad token goes on.
                self._refuse(self.refused.status, self.refused.value, self.refused.name.lower())
                return
        if self.early is not None:
            # Nothing reaches the instance (not even a connection) before the
            # connection's first request is admitted: a head split across
            # reads is held until it is whole.
            if not self.admitted:
                self.early.append(data)
                self.early_bytes += len(data)
                if self.early_bytes > MAX_HEAD_BYTES:
                    self._refuse(431, f"a head over {MAX_HEAD_BYTES} bytes", "head_too_large")
                return
            if self.early:
                data = b"".join((*self.early, data))
            self.early = None
        if self.up is not None:
            self.up.write(data)
        elif self.pending is not None:
            self.pending.append(data)
        else:
            self.pending = [data]
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            sock = await self.door.dial()
            try:
                await loop.sock_connect(sock, ("127.0.0.1", self.door.port))
                up, _ = await loop.create_connection(lambda: _Upstream(self), sock=sock)
            except BaseException:
                sock.close()
                raise
        except OSError as e:
            log.info("entry: instance %s unreachable: %s", self.door.instance_id, e)
            self._refuse(
                502, f"instance {self.door.instance_id} is not accepting connections", "unreachable"
            )
            return
        if self.transport.is_closing():
            up.close()
            return
        self.up = cast(asyncio.Transport, up)
        if self.pending:
            # What came while connecting, in one write.
            self.up.write(b"".join(self.pending))
        self.pending = None
        if self.eof_pending:
            self.up.write_eof()
            self.half_closed()

    def _refuse(self, status: int, message: str, reason: str) -> None:
        if not self.transport.is_closing():
            REFUSED.labels(reason).inc()
            self.transport.write(_answer(status, message))
            self.transport.close()
        if self.up is not None:
            self.up.close()

    def eof_received(self) -> bool:
        if self.up is not None and self.up.can_write_eof():
            self.up.write_eof()
            self.half_closed()
            return True  # half-close: the answer may still come
        if self.connecting is not None and not self.connecting.done():
            self.eof_pending = True  # passed on after what came before it
            return True
        return False

    def half_closed(self) -> None:
        """One direction has ended (its end passed on). Once both have, nothing
        more can flow: close both, each after writing what it holds (without
        this, a half-closed pair would stay open until the door closes)."""
        self.ended += 1
        if self.ended == 2:
            self.transport.close()
            if self.up is not None:
                self.up.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.over:
            return
        self.door.clients.discard(self)
        self.door.limits.open -= 1
        OPEN.dec()
        if self.timer is not None:
            self.timer.cancel()
        if self.up is not None:
            self.up.close()
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()

    def pause_writing(self) -> None:
        if self.up is not None:
            self.up.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None:
            self.up.resume_reading()


class Door:
    """The entry's listener for one instance.

    key: the cluster's lease key (None: every request is let in; a cluster
    without TLS material has no key, and says loudly that it checks nothing).
    dial: makes a socket in the instance's network namespace (``netns`` or
    ``sockclient``); the instance
    listens on its loopback at port. on_close: called once closed (lets go of
    the namespace). limits: the agent's ``EntryLimits``, shared by its doors
    (default: this door's own). clock_ms: wall clock, milliseconds.
    """

    def __init__(
        self,
        instance_id: str,
        port: int,
        key: LeaseKey | None,
        dial: Dial,
        on_close: Callable[[], None] = lambda: None,
        limits: EntryLimits | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.instance_id = instance_id
        self.limits = EntryLimits() if limits is None else limits
        self.port = port
        self.key = key
        self.dial = dial
        self._on_close = on_close
        self.clock_ms = clock_ms
        self.clients: set[_Client] = set()
        self._server: asyncio.AbstractServer | None = None
        self._route_key = None if key is None else key.route_key()
        #: Sends the next connection from (address, source port) to the
        #: instance through the kernel; its error or None (``routing``;
        #: None: this door relays every connection).
        self.route: Callable[[str, int], str | None] | None = None

    def route_request(self, value: bytes, transport: asyncio.BaseTransport) -> bytes:
        """The answer to a route request (``Galaxy-Route: PORT:TOKEN``)."""
        if self.route is None or self._route_key is None:
            return _answer(404, "this entry relays: send requests with a Galaxy-Lease")
        port, _, token = value.decode("ascii", "replace").partition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            verdict = Verdict.MALFORMED
        else:
            verdict = self._route_key.verify_route(token, self.port, int(port), self.clock_ms())
        if verdict is not Verdict.OK:
            ROUTED.labels("refused").inc()
            return _answer(verdict.status, _ROUTE_REFUSED[verdict])
        peer = str((transport.get_extra_info("peername") or ("",))[0]).removeprefix("::ffff:")
        if ":" in peer or not peer:
            return _answer(404, "routed entries are IPv4 only: send requests with a Galaxy-Lease")
        why = self.route(peer, int(port))
        if why is not None:
            log.warning("entry: cannot route for instance %s: %s", self.instance_id, why)
            return _answer(503, "cannot route now: send requests with a Galaxy-Lease")
        ROUTED.labels("admitted").inc()
        return _ROUTED

    async def open(self, host: str, port: int) -> None:
        """Listen on host:port (the node's advertised address)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, port)

    async def close(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for c in list(self.clients):
            c.transport.abort()
            if c.up is not None:
                c.up.abort()
        self._on_close()
        self._on_close = lambda: None
