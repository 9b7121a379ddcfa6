"""The state store interface shared by every backend.

Galaxy keeps durable control-plane state (function specs, instance and node
records) in a key-value store with etcd's data model: string keys, byte values,
a store-wide revision counter, leases that delete their keys when they expire,
and prefix watches. ``StateStore`` is that model as an asyncio interface;
``MemoryStore`` (embedded default, tests) and ``EtcdStore`` (production)
implement it with the same observable behaviour, checked by one contract suite.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType

# etcd's default --max-txn-ops. Both backends enforce the same limit so that code
# tested against the memory store does not break on a real etcd.
DEFAULT_MAX_TXN_OPS = 128


@dataclass(frozen=True)
class KV:
    """One key with its value.

    ``version`` is the store revision of the key's last modification (etcd's
    ``mod_revision``): always > 0 and increasing across the whole store, so it
    orders writes to different keys too and is what ``compare_and_swap`` checks.
    """

    key: str
    value: bytes
    version: int


class EventType(Enum):
    """Kind of a watch event."""

    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch.

    For ``DELETE`` the value is ``b""`` and ``version`` is the revision of the
    deletion (as in etcd).
    """

    type: EventType
    key: str
    value: bytes
    version: int


class StoreError(Exception):
    """Base class of state store errors."""


class StoreUnavailable(StoreError):
    """The backend could not be reached or did not answer in time.

    The operation may or may not have been applied; callers retry (writes in
    Galaxy are idempotent puts of the latest record, so a retry is safe).
    """


class LeaseNotFound(StoreError):
    """The lease does not exist: it expired, was revoked, or was never granted."""


class Watch(AsyncIterator[WatchEvent], abc.ABC):
    """A running prefix watch: an async iterator of ``WatchEvent``.

    Events are delivered in revision order for changes made after the watch is
    registered. Registration happens at the latest on the first ``__anext__``;
    ``await watch.started()`` (or ``async with``) registers it eagerly, so a
    caller can make sure a following write is seen.

    The iterator ends (``StopAsyncIteration``) after ``aclose()`` or when the
    store is closed. If the backend connection is lost it raises
    ``StoreUnavailable``: the caller should re-read the prefix and watch again,
    because events may have been missed.

    Prefer ``async with store.watch_prefix(p) as w: async for ev in w: ...``:
    breaking out of ``async for`` alone does not release the watch.
    """

    @abc.abstractmethod
    async def started(self) -> None:
        """Register the watch with the backend (idempotent)."""

    @abc.abstractmethod
    async def __anext__(self) -> WatchEvent:
        """Next event; blocks until one arrives."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop the watch and release its resources (idempotent)."""

    def __aiter__(self) -> Watch:
        return self

    async def __aenter__(self) -> Watch:
        await self.started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class StateStore(abc.ABC):
    """Async key-value store with revisions, leases and prefix watches.

    All methods may raise ``StoreUnavailable`` when the backend cannot be reached
    and ``StoreError`` after ``close()``. Keys are non-empty strings; values are
    bytes (any content).
    """

    #: Largest number of operations accepted by one ``put_many``/``delete_many``.
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS

    @abc.abstractmethod
    async def get(self, key: str) -> KV | None:
        """Return the key's current value and version, or None if absent."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write ``value`` at ``key`` and return the new store revision.

        With ``lease`` the key is deleted when the lease expires or is revoked;
        without it, any lease previously attached to the key is detached.
        Raises ``LeaseNotFound`` if the lease does not exist.
        """

    @abc.abstractmethod
    async def put_many(self, items: Sequence[tuple[str, bytes]], lease: int | None = None) -> int:
        """Write all items atomically (one revision) and return that revision.

        Readers see either none or all of the writes. If a key appears more than
        once the last value wins. Raises ``ValueError`` for more than
        ``max_txn_ops`` distinct keys. ``lease`` attaches every key to that
        lease, as ``put`` does (``LeaseNotFound`` if it does not exist).
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete ``key``; return True if it existed."""

    @abc.abstractmethod
    async def delete_many(self, keys: Sequence[str]) -> int:
        """Delete the keys atomically; return how many existed.

        Raises ``ValueError`` for more than ``max_txn_ops`` distinct keys.
        """

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> list[KV]:
        """All keys starting with ``prefix``, sorted by key."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Delete all keys starting with ``prefix``; return how many were deleted."""

    @abc.abstractmethod
    async def compare_and_swap(
        self, key: str, expected_version: int, value: bytes, lease: int | None = None
    ) -> bool:
        """Write ``value`` only if the key's version is ``expected_version``.

        ``expected_version == 0`` means "only if the key does not exist" (create).
        Returns True if the write happened, False if the version did not match.
        """

    @abc.abstractmethod
    def watch_prefix(self, prefix: str) -> Watch:
        """Watch all keys starting with ``prefix``; see ``Watch``."""

    @abc.abstractmethod
    async def grant_lease(self, ttl_s: float) -> int:
        """Create a lease that expires ``ttl_s`` seconds from now; return its id.

        Backends may round the TTL up (etcd grants whole seconds and enforces a
        server-side minimum).
        """

    @abc.abstractmethod
    async def refresh_lease(self, lease_id: int) -> None:
        """Restart the lease's TTL. Raises ``LeaseNotFound`` if it is gone."""

    @abc.abstractmethod
    async def revoke_lease(self, lease_id: int) -> None:
        """End the lease now, deleting its keys. Unknown leases are ignored."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and end all watches. Idempotent."""

    async def __aenter__(self) -> StateStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def dedupe_items(items: Sequence[tuple[str, bytes]], limit: int) -> dict[str, bytes]:
    """Collapse repeated keys (last value wins) and enforce the txn size limit.

    Shared by backends so both treat batches identically (etcd itself rejects a
    transaction that names a key twice).
    """
    merged: dict[str, bytes] = {}
    for key, value in items:
        check_key(key)
        merged[key] = value
    if len(merged) > limit:
        raise ValueError(f"batch of {len(merged)} keys exceeds max_txn_ops={limit}")
    return merged


def dedupe_keys(keys: Sequence[str], limit: int) -> list[str]:
    """Distinct keys in first-seen order, with the txn size limit enforced."""
    unique = list(dict.fromkeys(keys))
    for key in unique:
        check_key(key)
    if len(unique) > limit:
        raise ValueError(f"batch of {len(unique)} keys exceeds max_txn_ops={limit}")
    return unique


def check_key(key: str) -> None:
    """Reject keys etcd cannot store, identically in every backend."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a key must be a non-empty str, got {key!r}")
