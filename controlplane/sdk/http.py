"""The SDK's data path to function instances: HTTP/1.1 over one pooled
aiohttp session (keep-alive connections reused per instance, bodies read as
they arrive, chunked transfer decoded by the library).

A failure to connect means the request never left this process, so the
caller may retry it on another instance whatever the request is; any later
failure may have reached the instance and is only surfaced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from controlplane.runtime.errors import DeadlineExceeded, Unavailable
from controlplane.runtime.leasetoken import HEADER as LEASE_HEADER
from controlplane.sdk.entryroute import EntryRouter, RoutingConnector


class NotSent(Unavailable):
    """The instance could not be reached: the request was not sent (safe to
    retry anywhere)."""


class SentButFailed(Unavailable):
    """The connection failed after the request may have reached the instance."""


class HttpPool:
    """One aiohttp session for every instance (made on first use, in the
    running loop)."""

    def __init__(self, limit_per_host: int = 64, router: EntryRouter | None = None) -> None:
        self.limit_per_host = limit_per_host
        #: Routes new connections through instances' entries (``entryroute``).
        self.router = router
        self._session: aiohttp.ClientSession | None = None

    def _get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            per_host = self.limit_per_host
            connector = (
                aiohttp.TCPConnector(limit=0, limit_per_host=per_host)
                if self.router is None
                else RoutingConnector(self.router, limit=0, limit_per_host=per_host)
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Instances answer whatever they answer: no auto-decompression
                # surprises, no cookie state between unrelated requests.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                # Nor an Accept-Encoding the caller did not send: an answer
                # compressed on aiohttp's say-so would reach a client that
                # never asked for it (nothing here decompresses).
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    @asynccontextmanager
    async def open(
        self,
        address: str,
        path: str,
        body: bytes | bytearray,
        timeout_s: float,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        lease: str = "",
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response of one request, its body not yet read. lease: the
        grant's ``lease_token``, shown to the node's entry."""
        if lease:
            headers = {**headers, LEASE_HEADER: lease} if headers else {LEASE_HEADER: lease}
        url = f"http://{address}{path if path.startswith('/') else '/' + path}"
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._get().request(
                method, url, data=body, headers=headers, timeout=timeout
            ) as resp:
                yield resp
        except aiohttp.ClientConnectorError as e:
            raise NotSent(f"instance {address} unreachable: {e.os_error or e}") from None
        except TimeoutError:
            raise DeadlineExceeded(f"instance {address} did not answer in {timeout_s:g}s") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            raise SentButFailed(f"instance {address}: connection lost: {e}") from None
        except aiohttp.ClientPayloadError as e:
            raise SentButFailed(f"instance {address}: broken response body: {e}") from None

    async def request(
        self,
        address: str,
        path: str,
        body: bytes,
        timeout_s: float,
        method: str = "POST",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, Any]]:
        """Status, whole body and headers of one request."""
        async with self.open(address, path, body, timeout_s, method, headers) as resp:
            try:
                data = await resp.read()
            except aiohttp.ClientPayloadError as e:
                raise SentButFailed(f"instance {address}: broken response body: {e}") from None
            return resp.status, data, dict(resp.headers)

    async def close(self) -> None:
        """Close the session and its connections."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
            # Let the transports close (aiohttp's recommended grace).
            await asyncio.sleep(0)
        self._session = None
