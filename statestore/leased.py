"""Records that expire with their writer.

Instance records (Dispatch) and node records (ClusterMgr) describe what a
running process believes; when that process dies, they must not outlive it
with dead addresses and allocations. ``LeasedStore`` wraps a store so that
every key it puts is attached to one lease it keeps alive:

- the lease is granted on the first put and refreshed every ``ttl_s / 3``;
- if the process dies, the lease expires and the store deletes its keys
  within ``ttl_s`` (etcd does this itself; ``MemoryStore`` by its clock);
- if the lease was lost while the process lives (the store was down longer
  than the TTL), a new lease is granted and every live key is written again,
  so an outage costs the records for at most the outage;
- ``close()`` stops keeping the lease: the records expire within the TTL,
  so a restarted or replacement instance can adopt them first (``close(
  revoke=True)`` removes them at once).

Reads, deletes and watches pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from .base import KV, LeaseNotFound, StateStore, StoreError, StoreUnavailable, Watch

log = logging.getLogger(__name__)

#: Default lease TTL of records: a dead writer's records are gone this long
#: after its last refresh.
DEFAULT_RECORD_TTL_S = 10.0


class LeasedStore(StateStore):
    """A ``StateStore`` whose puts are attached to a lease kept alive while
    this object is open (see the module docstring)."""

    def __init__(self, inner: StateStore, ttl_s: float = DEFAULT_RECORD_TTL_S) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.inner = inner
        self.ttl_s = ttl_s
        self.max_txn_ops = inner.max_txn_ops
        self.lease_id: int | None = None
        #: Keys written through this store and not deleted, with their values:
        #: what is written again under a new lease.
        self._live: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        #: Counters for an exporter: leases granted, lost (expired while we
        #: lived) and keys restored after a loss.
        self.granted = 0
        self.lost = 0
        self.restored = 0
        self._unavailable = False

    # -- the lease -----------------------------------------------------------

    async def _lease(self) -> int:
        if self.lease_id is None:
            async with self._lock:
                if self.lease_id is None:
                    self.lease_id = await self.inner.grant_lease(self.ttl_s)
                    self.granted += 1
                    self._start_keeper()
        return self.lease_id

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(
                self._keep_alive(), name="statestore-lease"
            )

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            lease = self.lease_id
            if lease is None:
                continue
            try:
                await self.inner.refresh_lease(lease)
                if self._unavailable:
                    log.info("state store reachable again; records' lease kept")
                    self._unavailable = False
            except LeaseNotFound:
                await self._renew(lease)
            except StoreUnavailable as e:
                if not self._unavailable:
                    log.warning(
                        "state store unavailable: records are kept in memory and written "
                        "again when it is back (%s)",
                        e,
                    )
                    self._unavailable = True
            except StoreError:
                log.exception("refreshing the records' lease failed")

    async def _renew(self, lost: int) -> None:
        """The lease expired under us: take a new one and write every live
        key again (records of this process must exist while it lives)."""
        async with self._lock:
            if self.lease_id != lost:
                return  # someone renewed it already
            self.lost += 1
            self.lease_id = None
        lease = await self._lease()
        items = list(self._live.items())
        for i in range(0, len(items), self.max_txn_ops):
            await self.inner.put_many(items[i : i + self.max_txn_ops], lease=lease)
        self.restored += len(items)
        log.warning("records' lease expired; %d records written again under a new one", len(items))

    # -- writes: attached to the lease -------------------------------------

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Put ``key`` under this store's lease (an explicit ``lease`` wins)."""
        if lease is not None:
            return await self.inner.put(key, value, lease=lease)
        own = await self._lease()
        try:
            rev = await self.inner.put(key, value, lease=own)
        except LeaseNotFound:
            await self._renew(own)
            rev = await self.inner.put(key, value, lease=await self._lease())
        self._live[key] = bytes(value)
        return rev

    async def put_many(self, items: Sequence[tuple[str, bytes]], lease: int | None = None) -> int:
        """Put every item under this store's lease (an explicit ``lease`` wins)."""
        if lease is not None:
            return await self.inner.put_many(items, lease=lease)
        own = await self._lease()
        try:
            rev = await self.inner.put_many(items, lease=own)
        except LeaseNotFound:
            await self._renew(own)
            rev = await self.inner.put_many(items, lease=await self._lease())
        for key, value in items:
            self._live[key] = bytes(value)
        return rev

    async def delete(self, key: str) -> bool:
        """Delete ``key`` (and stop keeping it)."""
        self._live.pop(key, None)
        return await self.inner.delete(key)

    async def delete_many(self, keys: Sequence[str]) -> int:
        """Delete ``keys`` (and stop keeping them)."""
        for key in keys:
            self._live.pop(key, None)
        return await self.inner.delete_many(keys)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``."""
        for key in [k for k in self._live if k.startswith(prefix)]:
            del self._live[key]
        return await self.inner.delete_prefix(prefix)

    async def compare_and_swap(
        self, key: str, expected_version: int, value: bytes, lease: int | None = None
    ) -> bool:
        """Passed through: a compare-and-swap is not a record."""
        return await self.inner.compare_and_swap(key, expected_version, value, lease=lease)

    # -- reads, watches and leases: passed through ---------------------------

    async def get(self, key: str) -> KV | None:
        """See ``StateStore.get``."""
        return await self.inner.get(key)

    async def get_prefix(self, prefix: str) -> list[KV]:
        """See ``StateStore.get_prefix``."""
        return await self.inner.get_prefix(prefix)

    def watch_prefix(self, prefix: str) -> Watch:
        """See ``StateStore.watch_prefix``."""
        return self.inner.watch_prefix(prefix)

    async def grant_lease(self, ttl_s: float) -> int:
        """See ``StateStore.grant_lease``."""
        return await self.inner.grant_lease(ttl_s)

    async def refresh_lease(self, lease_id: int) -> None:
        """See ``StateStore.refresh_lease``."""
        await self.inner.refresh_lease(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        """See ``StateStore.revoke_lease``."""
        await self.inner.revoke_lease(lease_id)

    async def close(self, revoke: bool = False) -> None:
        """Stop keeping the lease and close the inner store. The records then
        expire within the TTL, which leaves a successor (a restarted or
        replacement instance) that long to adopt them; ``revoke=True`` removes
        them at once."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if revoke and self.lease_id is not None:
            try:
                await asyncio.wait_for(self.inner.revoke_lease(self.lease_id), self.ttl_s)
            except (StoreError, TimeoutError) as e:
                log.warning("could not revoke the records' lease (they expire by TTL): %s", e)
        self.lease_id = None
        await self.inner.close()

    def abandon(self) -> None:
        """Stop keeping the lease without revoking it: what a crash does
        (tests use it to see the records expire)."""
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
