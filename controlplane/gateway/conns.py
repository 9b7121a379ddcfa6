"""Connection-level guards of the gateway: a bound on open connections and
a deadline for a request's head (slow clients that open a connection and
trickle a header never reach a handler, so no handler can time them out).

aiohttp bounds header sizes (``max_line_size``, ``max_field_size``) and
closes idle keep-alive connections (``keepalive_timeout``), but has no
connection bound and no header-read deadline: this wraps its protocol
factory to add both, and nothing else (the wrapped protocol does all the
HTTP).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from controlplane.gateway.guard import Refusals

#: Written to a connection beyond the bound, then closed: a client gets an
#: answer it can act on instead of a reset.
FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 66\r\n\r\n"
    b'{"error": {"message": "gateway: too many connections; retry"}}    '
)


class Guarded(asyncio.Protocol):
    """One connection: the aiohttp protocol inside, plus a timer that closes
    the connection when a request head takes longer than ``head_s`` from
    its first byte (or from the connection's start)."""

    def __init__(self, owner: Connections, inner: asyncio.Protocol | None) -> None:
        self.owner = owner
        self.inner = inner
        self.transport: Any = None
        self.timer: asyncio.TimerHandle | None = None
        #: a handler runs for this connection (its head was read)
        self.busy = False

    def connection_made(self, transport: Any) -> None:
        # Any: uvloop's transports are not asyncio.Transport subclasses.
        self.transport = transport
        if self.inner is None:  # beyond the bound: answer and close
            transport.write(FULL)
            transport.close()
            return
        self.owner.by_transport[transport] = self
        self.inner.connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self.timer is None:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(self.owner.head_s, self._slow)

    def _slow(self) -> None:
        self.timer = None
        if not self.busy and self.transport is not None:
            self.owner.refusals.refuse("header_timeout", "", "", "request head too slow")
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self._arm()  # a new head starts (or goes on): it has head_s
        assert self.inner is not None
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.inner is None:
            return
        self.owner.open -= 1
        if self.transport is not None:
            self.owner.by_transport.pop(self.transport, None)
        self.inner.connection_lost(exc)


class Connections:
    """The protocol factory given to ``loop.create_server``: at most
    ``limit`` connections open (the rest get a 503 and are closed), each
    with a head deadline. ``started``/``ended`` mark a request's handler."""

    def __init__(
        self, factory: Callable[[], Any], limit: int, head_s: float, refusals: Refusals
    ) -> None:
        self.factory = factory
        self.limit = limit
        self.head_s = head_s
        self.refusals = refusals
        self.open = 0
        self.by_transport: dict[Any, Guarded] = {}

    def __call__(self) -> Guarded:
        if self.open >= self.limit:
            self.refusals.refuse("connections", "", "", f"more than {self.limit} connections")
            return Guarded(self, None)
        self.open += 1
        return Guarded(self, self.factory())

    def started(self, transport: Any) -> None:
        """A request's head was read: its handler runs (no head deadline)."""
        g = self.by_transport.get(transport)
        if g is not None:
            g.busy = True
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None

    def ended(self, transport: Any) -> None:
        """The handler returned: the next head gets its deadline from its
        first byte (aiohttp's keep-alive timeout covers the idle time)."""
        g = self.by_transport.get(transport)
        if g is not None:
            g.busy = False
