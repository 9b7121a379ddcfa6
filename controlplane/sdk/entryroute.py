"""Routed connections to instances (the caller's side of
``controlplane/nodeagent/entry/routing.py``).

A caller that holds the cluster's route key (the gateway) asks an
instance's door, before it opens a connection, to route that connection:
it binds a socket to a source port, sends the door a route token for that
port (``RouteKey.sign_route``) on a connection of its own, and on 204
connects from the port. The node's NAT then sends the connection straight
to the instance, with no relay. Any other answer (an entry that relays, an
agent that is not root, an IPv6 address) leaves the connection to the door,
which checks each request's lease as always: routing changes the cost of a
request, never whether it is admitted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client import Counter

from controlplane.runtime.leasetoken import ROUTE_HEADER, ROUTE_TTL_MS, RouteKey

log = logging.getLogger(__name__)

#: How long an entry that does not route is not asked again.
RELAY_S = 60.0
#: How long a route request may take (it is one local round trip).
ASK_S = 2.0

ROUTES = Counter(
    "galaxy_gateway_entry_routes_total",
    "New connections to instances: routed through the kernel (routed), through the "
    "door's relay (relayed: the entry does not route), or admitted but not taken by "
    "the node (failed: then relayed)",
    ["outcome"],
)
for _outcome in ("routed", "relayed", "failed"):
    ROUTES.labels(_outcome)


class EntryRouter:
    """Gets routed sockets from instances' entries. key: the cluster's
    route key (``route.key``); clock_ms: wall clock (route tokens name their end)."""

    def __init__(
        self,
        key: RouteKey,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        relay_s: float = RELAY_S,
    ) -> None:
        self.key = key
        self.clock_ms = clock_ms
        self.relay_s = relay_s
        self._relays: dict[tuple[str, int], float] = {}  # entry -> until (monotonic)

    async def ask(self, host: str, port: int) -> socket.socket | None:
        """A socket bound to a source port the entry at host:port routes,
        not yet connected; None: connect as usual (through the door).
        OSError: the entry cannot be reached at all."""
        until = self._relays.get((host, port))
        if until is not None and until > time.monotonic():
            return None
        if ":" in host:  # IPv6: the node's NAT is IPv4 only
            ROUTES.labels("relayed").inc()
            self._relay(host, port)
            return None
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), ASK_S)
        sock = None
        try:
            # The same source address the connection will have.
            local = writer.get_extra_info("sockname")[0]
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.bind((local, 0))
            source = sock.getsockname()[1]
            token = self.key.sign_route(port, source, self.clock_ms() + ROUTE_TTL_MS)
            writer.write(
                f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\n{ROUTE_HEADER}: {source}:{token}\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            status = await asyncio.wait_for(reader.readline(), ASK_S)
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        finally:
            writer.close()
        parts = status.split()
        if len(parts) >= 2 and parts[1] == b"204":
            return sock
        sock.close()
        log.info("entry %s:%s does not route (%s): its door relays", host, port, status[:80])
        ROUTES.labels("relayed").inc()
        self._relay(host, port)
        return None

    async def connect(self, sock: socket.socket, host: str, port: int) -> bool:
        """Connect a routed socket (within ASK_S: a routed connection is as
        near as the door); False, the socket closed and the entry relayed
        from now on, when the node did not take it (a node that cannot
        forward, a firewall on the way): the caller goes through the door."""
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, (host, port)), ASK_S
            )
        except BaseException as e:
            sock.close()
            if not isinstance(e, OSError):  # (a timeout is one)
                raise
            ROUTES.labels("failed").inc()
            log.warning(
                "entry %s:%s routed a connection it did not take (%s): relaying", host, port, e
            )
            self._relay(host, port)
            return False
        ROUTES.labels("routed").inc()
        return True

    def _relay(self, host: str, port: int) -> None:
        """Send host:port's connections through its door for relay_s."""
        self._relays[(host, port)] = time.monotonic() + self.relay_s
        if len(self._relays) > 4096:  # bounded: forget the ones that ended
            now = time.monotonic()
            self._relays = {k: t for k, t in self._relays.items() if t > now}


class RoutingConnector(aiohttp.TCPConnector):
    """aiohttp's connector, with a new connection routed when its entry
    agrees (``EntryRouter``), and made the usual way otherwise."""

    def __init__(self, router: EntryRouter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.router = router

    async def _wrap_create_connection(  # type: ignore[override]
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> Any:
        address = next((a[4] for a in addr_infos if a[0] == socket.AF_INET), None)
        sock = None
        if address is not None:
            try:
                sock = await self.router.ask(address[0], address[1])
            except OSError as e:  # (a timeout too: nothing was sent)
                raise client_error(req.connection_key, e) from e
            if sock is not None and not await self.router.connect(sock, *address[:2]):
                sock = None
        if sock is None:
            return await super()._wrap_create_connection(
                *args, addr_infos=addr_infos, req=req, timeout=timeout,
                client_error=client_error, **kwargs,
            )  # fmt: skip
        try:
            return await asyncio.get_running_loop().create_connection(*args, **kwargs, sock=sock)
        except BaseException:
            sock.close()
            raise
