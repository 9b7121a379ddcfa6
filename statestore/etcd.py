"""etcd v3 backend over the asyncio ``aetcd`` client.

Notes on aetcd that shape this module:

* ``aetcd.Client`` connects lazily (the gRPC channel is made on first use) and
  takes one ``timeout`` that it passes as the gRPC deadline of every unary call,
  the lease keep-alive call and watch creation. The watch stream itself has no
  deadline (it is long-lived); watch creation is additionally wrapped in
  ``asyncio.wait_for`` because aetcd can block on its internal request queue.
* A gRPC channel reconnects by itself, but with exponential backoff of up to
  two minutes by default; the channel options below cap it at one second so a
  restarted etcd is used again promptly.
* The client talks to one endpoint. With several endpoints this store moves to
  the next one after a connection failure (the old client is closed after a
  grace period so calls still in flight on it finish normally).
* aetcd raises ``ConnectionFailedError`` (UNAVAILABLE), ``ConnectionTimeoutError``
  (DEADLINE_EXCEEDED), ``WatchTimeoutError`` and a plain ``ClientError`` for
  other gRPC codes (e.g. NOT_FOUND for a missing lease); ``_translate`` maps
  them onto the ``statestore`` exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import aetcd
import aetcd.exceptions
import aetcd.rtypes
import grpc

from .base import (
    DEFAULT_MAX_TXN_OPS,
    KV,
    EventType,
    LeaseNotFound,
    StateStore,
    StoreError,
    StoreUnavailable,
    Watch,
    WatchEvent,
    check_key,
    dedupe_items,
    dedupe_keys,
)
from .etcd_tls import EtcdTls, TlsClient

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0

_CHANNEL_OPTIONS: dict[str, Any] = {
    # Reconnect quickly after an etcd restart instead of backing off for minutes.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Not a backoff: the least time a connection attempt gets to complete
    # (gRPC's default, 20 s). At 100 ms an etcd a moment late with its
    # HTTP/2 SETTINGS failed the call with UNAVAILABLE (controlplane/runtime/
    # rpc.py says more); each call's deadline still bounds the wait.
    "grpc.min_reconnect_backoff_ms": 20_000,
    # Detect a dead peer under an idle watch stream. etcd's default
    # --grpc-keepalive-min-time is 5 s; pinging more often gets the connection
    # closed with "too_many_pings", and pings without an active call are refused.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
}

# gRPC codes after which the same call may succeed later (server down, overloaded,
# leader election in progress).
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
}


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``; port defaults to 2379)."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or (host.startswith("[") != host.endswith("]")) or "]" in port:
        host, port = endpoint.strip(), "2379"
    if not host or not port.isdigit():
        raise ValueError(f"bad etcd endpoint {endpoint!r}: expected host:port")
    return host, int(port)


def _encode(key: str) -> bytes:
    check_key(key)
    return key.encode("utf-8", "surrogateescape")


def _decode(key: bytes) -> str:
    # surrogateescape round-trips keys written by other tools that are not UTF-8.
    return key.decode("utf-8", "surrogateescape")


def _grpc_code(error: BaseException) -> grpc.StatusCode | None:
    cause = error.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        code: grpc.StatusCode = cause.code()
        return code
    return None


class _EtcdWatch(Watch):
    def __init__(self, store: EtcdStore, prefix: str) -> None:
        self._store = store
        self._prefix = _encode(prefix)
        self._watch: aetcd.rtypes.Watch | None = None
        self._client: aetcd.Client | None = None
        self._events: Any = None
        self._start_lock = asyncio.Lock()
        self._closed = False

    async def started(self) -> None:
        """Create the server-side watch (one round trip), once."""
        async with self._start_lock:
            if self._watch is not None:
                return
            if self._closed:
                raise StoreError("watch is closed")
            client = self._client = self._store._client()
            with self._store._translate(client):
                # aetcd's own timeout covers the reply, not its request queue.
                watch = await asyncio.wait_for(
                    client.watch_prefix(self._prefix), self._store.timeout_s * 2
                )
            self._watch = watch
            self._events = watch.__aiter__()
            self._store._watches.add(self)

    async def __anext__(self) -> WatchEvent:
        """Next event from the etcd watch stream."""
        if self._closed:
            raise StopAsyncIteration
        if self._watch is None:
            await self.started()
        try:
            event = await self._events.__anext__()
        except StopAsyncIteration:
            if self._closed or self._store._closed:
                raise
            # aetcd ends the iterator silently when its client is shut down (e.g.
            # after a failover); events may be lost, so the caller must resync.
            raise StoreUnavailable("etcd watch stream ended; re-read and watch again") from None
        except aetcd.exceptions.ClientError as e:
            if self._closed:
                raise StopAsyncIteration from None
            self._store._translate_error(e, self._client)
        kind = EventType.PUT if event.kind == "PUT" else EventType.DELETE
        value = event.kv.value if kind is EventType.PUT else b""
        return WatchEvent(kind, _decode(event.kv.key), value, event.kv.mod_revision)

    async def aclose(self) -> None:
        """Cancel the server-side watch; errors are ignored (the stream may be gone)."""
        if self._closed:
            return
        self._closed = True
        self._store._watches.discard(self)
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._watch.cancel(), self._store.timeout_s)


class EtcdStore(StateStore):
    """``StateStore`` on an etcd v3 cluster (tested with etcd 3.4)."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        username: str | None = None,
        password: str | None = None,
        tls: EtcdTls | None = None,
    ) -> None:
        """``endpoints`` are ``host:port`` strings; no connection is made until first use.

        ``timeout_s`` bounds every call; ``max_txn_ops`` must not exceed the
        server's ``--max-txn-ops`` (default 128). ``tls``: talk TLS (with a
        client certificate when it holds one) instead of plaintext.
        """
        if not endpoints:
            raise ValueError("EtcdStore needs at least one host:port endpoint")
        if (username is None) != (password is None):
            raise ValueError("etcd credentials: give both a user and a password, or neither")
        # etcd's own authentication (a token per connection); the password is
        # never logged or put in a URL.
        self._username = username
        self._password = password
        self._tls = tls
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self.timeout_s = timeout_s
        self.max_txn_ops = max_txn_ops
        self._index = 0
        self._current: aetcd.Client | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._watches: set[_EtcdWatch] = set()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The ``host:port`` currently in use."""
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    # --- connection management -----------------------------------------

    def _client(self) -> aetcd.Client:
        if self._closed:
            raise StoreError("the etcd store is closed")
        if self._current is None:
            host, port = self._endpoints[self._index]
            # aetcd documents timeout as int but hands it to gRPC, which takes float.
            common: dict[str, Any] = {
                "username": self._username,
                "password": self._password,
                "timeout": self.timeout_s,
                "options": _CHANNEL_OPTIONS,
            }
            if self._tls is None:
                self._current = aetcd.Client(host, port, **common)
            else:
                self._current = TlsClient(host, port, tls=self._tls, **common)
        return self._current

    def _failover(self, failed: aetcd.Client | None) -> None:
        """After a connection failure, move to the next endpoint (if there is one)."""
        if len(self._endpoints) < 2 or failed is None or failed is not self._current:
            # One endpoint: keep the channel, gRPC reconnects on its own.
            return
        self._index = (self._index + 1) % len(self._endpoints)
        self._current = None
        log.warning("etcd endpoint failed, switching to %s", self.endpoint)
        task = asyncio.get_running_loop().create_task(self._retire(failed))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, client: aetcd.Client) -> None:
        # Calls in flight carry a deadline of timeout_s; let them finish first.
        try:
            await asyncio.sleep(self.timeout_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self.timeout_s)

    def _translate_error(self, error: BaseException, client: aetcd.Client | None) -> NoReturn:
        code = _grpc_code(error)
        if isinstance(
            error,
            (
                aetcd.exceptions.ConnectionFailedError,
                aetcd.exceptions.ConnectionTimeoutError,
                aetcd.exceptions.WatchTimeoutError,
                TimeoutError,
            ),
        ) or (code in _RETRYABLE):
            self._failover(client)
            raise StoreUnavailable(f"etcd at {self.endpoint} unavailable: {error}") from error
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in str(error):
            raise LeaseNotFound(str(error)) from error
        raise StoreError(f"etcd error: {error}") from error

    @contextlib.contextmanager
    def _translate(self, client: aetcd.Client) -> Iterator[None]:
        try:
            yield
        except (aetcd.exceptions.ClientError, TimeoutError) as e:
            self._translate_error(e, client)

    # --- KV --------------------------------------------------------------

    async def get(self, key: str) -> KV | None:
        """See ``StateStore.get``."""
        client = self._client()
        with self._translate(client):
            got = await client.get(_encode(key))
        return None if got is None else KV(key, got.value, got.mod_revision)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """See ``StateStore.put``."""
        client = self._client()
        with self._translate(client):
            result = await client.put(_encode(key), bytes(value), lease=lease or 0)
        revision: int = result.header.revision
        return revision

    async def _txn(
        self, client: aetcd.Client, compare: list[Any], success: list[Any]
    ) -> tuple[bool, list[Any]]:
        with self._translate(client):
            ok, responses = await client.transaction(compare=compare, success=success, failure=[])
        return bool(ok), responses

    async def put_many(self, items: Sequence[tuple[str, bytes]], lease: int | None = None) -> int:
        """See ``StateStore.put_many``; one etcd transaction."""
        merged = dedupe_items(items, self.max_txn_ops)
        client = self._client()
        if not merged:
            return await self._current_revision(client)
        ops = [
            client.transactions.put(_encode(k), bytes(v), lease=lease or 0)
            for k, v in merged.items()
        ]
        _, responses = await self._txn(client, [], ops)
        revision: int = responses[0].response_put.header.revision
        return revision

    async def _current_revision(self, client: aetcd.Client) -> int:
        with self._translate(client):
            # Any read returns the store revision in its header; ask for nothing.
            result = await client.get_prefix(b"\x00statestore-revision-probe", keys_only=True)
        revision: int = result.header.revision
        return revision

    async def delete(self, key: str) -> bool:
        """See ``StateStore.delete``."""
        client = self._client()
        with self._translate(client):
            result = await client.delete(_encode(key))
        return result is not None

    async def delete_many(self, keys: Sequence[str]) -> int:
        """See ``StateStore.delete_many``; one etcd transaction."""
        unique = dedupe_keys(keys, self.max_txn_ops)
        if not unique:
            return 0
        client = self._client()
        ops = [client.transactions.delete(_encode(k)) for k in unique]
        _, responses = await self._txn(client, [], ops)
        return sum(int(r.response_delete_range.deleted) for r in responses)

    async def get_prefix(self, prefix: str) -> list[KV]:
        """See ``StateStore.get_prefix``."""
        client = self._client()
        with self._translate(client):
            result = await client.get_prefix(_encode(prefix), sort_order="ascend")
        return [KV(_decode(kv.key), kv.value, kv.mod_revision) for kv in result]

    async def delete_prefix(self, prefix: str) -> int:
        """See ``StateStore.delete_prefix``."""
        client = self._client()
        with self._translate(client):
            result = await client.delete_prefix(_encode(prefix))
        return int(result.deleted)

    async def compare_and_swap(
        self, key: str, expected_version: int, value: bytes, lease: int | None = None
    ) -> bool:
        """See ``StateStore.compare_and_swap``; a transaction on mod_revision.

        A missing key compares as mod_revision 0 in etcd, which gives the
        create-if-absent case for free.
        """
        raw = _encode(key)
        client = self._client()
        t = client.transactions
        ok, _ = await self._txn(
            client,
            [t.mod(raw) == expected_version],
            [t.put(raw, bytes(value), lease=lease or 0)],
        )
        return ok

    def watch_prefix(self, prefix: str) -> Watch:
        """See ``StateStore.watch_prefix``; registered on ``started()``/first event."""
        if self._closed:
            raise StoreError("the etcd store is closed")
        return _EtcdWatch(self, prefix)

    # --- leases ----------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> int:
        """See ``StateStore.grant_lease``; rounded up to whole seconds (at least 1)."""
        if ttl_s <= 0:
            raise ValueError(f"lease TTL must be positive, got {ttl_s}")
        client = self._client()
        with self._translate(client):
            lease = await client.lease(max(1, math.ceil(ttl_s)))
        lease_id: int = lease.id
        return lease_id

    async def refresh_lease(self, lease_id: int) -> None:
        """See ``StateStore.refresh_lease``."""
        client = self._client()
        with self._translate(client):
            reply = await client.refresh_lease(lease_id)
        # etcd answers a keep-alive for an unknown lease with TTL 0 instead of an error.
        if reply is None or reply.TTL <= 0:
            raise LeaseNotFound(f"lease {lease_id} not found (expired or revoked)")

    async def revoke_lease(self, lease_id: int) -> None:
        """See ``StateStore.revoke_lease``."""
        client = self._client()
        with contextlib.suppress(LeaseNotFound), self._translate(client):
            await client.revoke_lease(lease_id)

    async def close(self) -> None:
        """End watches and close every gRPC channel this store opened."""
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.aclose()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        client, self._current = self._current, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self.timeout_s)
