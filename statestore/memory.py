"""In-process state store with etcd semantics: the embedded default and the test double.

Revisions, lease expiry and watch ordering follow etcd so that code written against
this store behaves the same on a real cluster (the contract suite runs on both).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.runtime.clock import Clock, MonotonicClock

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

# A watcher that falls this far behind is cut off instead of growing without bound;
# like a lost etcd stream, the consumer re-reads and watches again.
DEFAULT_WATCH_BUFFER = 10_000


@dataclass
class _Entry:
    value: bytes
    version: int
    lease: int | None


@dataclass
class _Lease:
    ttl_s: float
    deadline: float
    keys: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


class _MemoryWatch(Watch):
    """Events are pushed synchronously by the store, so registration is immediate."""

    def __init__(self, store: MemoryStore, prefix: str, max_buffer: int) -> None:
        self._store = store
        self._prefix = prefix
        self._max_buffer = max_buffer
        self._buffer: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._error: StoreError | None = None

    def _deliver(self, event: WatchEvent) -> None:
        if self._closed or self._error is not None or not event.key.startswith(self._prefix):
            return
        if len(self._buffer) >= self._max_buffer:
            self._error = StoreUnavailable(
                f"watch on {self._prefix!r} fell {self._max_buffer} events behind; "
                "re-read the prefix and watch again"
            )
            self._store._watchers.discard(self)
        else:
            self._buffer.append(event)
        self._wakeup.set()

    def _end(self) -> None:
        self._closed = True
        self._wakeup.set()

    async def started(self) -> None:
        """Already registered at creation; nothing to do."""

    async def __anext__(self) -> WatchEvent:
        """Next buffered event, waiting for one if needed."""
        while True:
            # Buffered events are still handed out after an overflow so that the
            # consumer sees everything up to the gap, then the error.
            if self._buffer and not self._closed:
                return self._buffer.popleft()
            if self._closed:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            self._wakeup.clear()
            await self._wakeup.wait()

    async def aclose(self) -> None:
        """Unregister from the store and end iteration."""
        self._store._watchers.discard(self)
        self._end()


class MemoryStore(StateStore):
    """A ``StateStore`` held in this process; nothing survives the process.

    Lease expiry uses the injected clock. It is checked lazily at the start of
    every operation and by ``expire_leases()``; with a real-time clock (the
    default) a timer also fires at each lease deadline so that watchers see the
    DELETE of an idle key without waiting for the next operation.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        expiry_timers: bool | None = None,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        watch_buffer: int = DEFAULT_WATCH_BUFFER,
    ) -> None:
        """Create an empty store.

        ``expiry_timers`` defaults to True only when no clock is given: timers run
        on the event loop's real time, which a manual test clock does not follow.
        """
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._expiry_timers = clock is None if expiry_timers is None else expiry_timers
        self.max_txn_ops = max_txn_ops
        self._watch_buffer = watch_buffer
        self._data: dict[str, _Entry] = {}
        # etcd starts at revision 1 and the first write gets 2; mirror that.
        self._revision = 1
        self._leases: dict[int, _Lease] = {}
        # (deadline, lease id); entries made stale by a refresh are skipped on pop.
        self._expiry_heap: list[tuple[float, int]] = []
        self._lease_ids = itertools.count(1)
        # Weak: a watch the caller dropped without aclose() must not leak.
        self._watchers: weakref.WeakSet[_MemoryWatch] = weakref.WeakSet()
        self._closed = False

    # --- internals -------------------------------------------------------

    def _begin(self) -> None:
        """Common prologue: refuse use after close, then apply due expiries."""
        if self._closed:
            raise StoreError("the memory store is closed")
        self.expire_leases()

    def _notify(self, event: WatchEvent) -> None:
        for watcher in list(self._watchers):
            watcher._deliver(event)

    def _set(self, key: str, value: bytes, lease: int | None, revision: int) -> None:
        old = self._data.get(key)
        if old is not None and old.lease is not None and old.lease != lease:
            self._leases[old.lease].keys.discard(key)
        if lease is not None:
            self._leases[lease].keys.add(key)
        self._data[key] = _Entry(value, revision, lease)
        self._notify(WatchEvent(EventType.PUT, key, value, revision))

    def _remove(self, key: str, revision: int) -> bool:
        entry = self._data.pop(key, None)
        if entry is None:
            return False
        if entry.lease is not None:
            self._leases[entry.lease].keys.discard(key)
        self._notify(WatchEvent(EventType.DELETE, key, b"", revision))
        return True

    def _remove_all(self, keys: Sequence[str]) -> int:
        """Delete existing keys under one new revision (none if nothing exists)."""
        present = [k for k in keys if k in self._data]
        if not present:
            return 0
        self._revision += 1
        for key in present:
            self._remove(key, self._revision)
        return len(present)

    def _check_lease(self, lease: int | None) -> int | None:
        # etcd treats lease id 0 as "no lease".
        if not lease:
            return None
        if lease not in self._leases:
            raise LeaseNotFound(f"lease {lease} not found")
        return lease

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        if lease.timer is not None:
            lease.timer.cancel()
        # Keys go first (one revision, as etcd's revoke), then the lease itself.
        self._remove_all(sorted(lease.keys))
        del self._leases[lease_id]

    def _schedule(self, lease_id: int, lease: _Lease) -> None:
        heapq.heappush(self._expiry_heap, (lease.deadline, lease_id))
        if not self._expiry_timers:
            return
        if lease.timer is not None:
            lease.timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, lease.deadline - self._clock.now())
        lease.timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        if not self._closed:
            self.expire_leases()

    # --- public API ------------------------------------------------------

    def expire_leases(self) -> int:
        """Revoke every lease whose deadline has passed; return how many expired."""
        now = self._clock.now()
        expired = 0
        while self._expiry_heap and self._expiry_heap[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._expiry_heap)
            lease = self._leases.get(lease_id)
            # A refreshed lease left its old heap entry behind; skip it.
            if lease is None or lease.deadline != deadline:
                continue
            self._drop_lease(lease_id)
            expired += 1
        return expired

    async def get(self, key: str) -> KV | None:
        """See ``StateStore.get``."""
        self._begin()
        check_key(key)
        entry = self._data.get(key)
        return None if entry is None else KV(key, entry.value, entry.version)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """See ``StateStore.put``."""
        self._begin()
        check_key(key)
        lease = self._check_lease(lease)
        self._revision += 1
        self._set(key, bytes(value), lease, self._revision)
        return self._revision

    async def put_many(self, items: Sequence[tuple[str, bytes]], lease: int | None = None) -> int:
        """See ``StateStore.put_many``."""
        self._begin()
        merged = dedupe_items(items, self.max_txn_ops)
        lease = self._check_lease(lease)
        if not merged:
            return self._revision
        # Everything happens without an await, so no reader can see half a batch.
        self._revision += 1
        for key, value in merged.items():
            self._set(key, bytes(value), lease, self._revision)
        return self._revision

    async def delete(self, key: str) -> bool:
        """See ``StateStore.delete``."""
        self._begin()
        check_key(key)
        return self._remove_all([key]) == 1

    async def delete_many(self, keys: Sequence[str]) -> int:
        """See ``StateStore.delete_many``."""
        self._begin()
        return self._remove_all(dedupe_keys(keys, self.max_txn_ops))

    async def get_prefix(self, prefix: str) -> list[KV]:
        """See ``StateStore.get_prefix``."""
        self._begin()
        check_key(prefix)
        # Python orders str by code point, which is etcd's UTF-8 byte order.
        return [
            KV(k, self._data[k].value, self._data[k].version)
            for k in sorted(k for k in self._data if k.startswith(prefix))
        ]

    async def delete_prefix(self, prefix: str) -> int:
        """See ``StateStore.delete_prefix``."""
        self._begin()
        check_key(prefix)
        return self._remove_all(sorted(k for k in self._data if k.startswith(prefix)))

    async def compare_and_swap(
        self, key: str, expected_version: int, value: bytes, lease: int | None = None
    ) -> bool:
        """See ``StateStore.compare_and_swap``."""
        self._begin()
        check_key(key)
        lease = self._check_lease(lease)
        entry = self._data.get(key)
        current = 0 if entry is None else entry.version
        if current != expected_version:
            return False
        self._revision += 1
        self._set(key, bytes(value), lease, self._revision)
        return True

    def watch_prefix(self, prefix: str) -> Watch:
        """See ``StateStore.watch_prefix``; registered immediately."""
        if self._closed:
            raise StoreError("the memory store is closed")
        check_key(prefix)
        watch = _MemoryWatch(self, prefix, self._watch_buffer)
        self._watchers.add(watch)
        return watch

    async def grant_lease(self, ttl_s: float) -> int:
        """See ``StateStore.grant_lease``; the TTL is used exactly."""
        self._begin()
        if ttl_s <= 0:
            raise ValueError(f"lease TTL must be positive, got {ttl_s}")
        lease_id = next(self._lease_ids)
        lease = _Lease(ttl_s=ttl_s, deadline=self._clock.now() + ttl_s)
        self._leases[lease_id] = lease
        self._schedule(lease_id, lease)
        return lease_id

    async def refresh_lease(self, lease_id: int) -> None:
        """See ``StateStore.refresh_lease``."""
        self._begin()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFound(f"lease {lease_id} not found (expired or revoked)")
        lease.deadline = self._clock.now() + lease.ttl_s
        self._schedule(lease_id, lease)

    async def revoke_lease(self, lease_id: int) -> None:
        """See ``StateStore.revoke_lease``."""
        self._begin()
        self._drop_lease(lease_id)

    async def close(self) -> None:
        """End all watches and cancel expiry timers; the data is discarded."""
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        for watcher in list(self._watchers):
            watcher._end()
        self._watchers.clear()
