"""Write-behind queue: record writes leave the request path and reach the store in batches.

Galaxy's dispatch and scale-up paths must never await etcd (DESIGN.md, "State").
They call ``WriteBehind.put``/``delete``, which only update an in-memory map; a
background task writes the map out with ``put_many``/``delete_many``. Only the
latest value per key matters (records describe current state), so repeated
writes to a key coalesce and an outage costs memory for the distinct keys only.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Gauge

from controlplane.runtime.metrics import QUEUE_LIMIT, ensure_registered

from .base import StateStore, StoreUnavailable

PENDING = Gauge(
    "galaxy_store_pending_writes",
    "Records queued for the state store and not yet written (bounded by max_pending)",
    registry=None,  # exported by the processes that write behind (ensure_registered)
)

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass
class _Entry:
    # None means "delete the key".
    value: bytes | None
    # Sequence number of the oldest write to this key that is not durable yet. A
    # flush() issued after that write must wait for this entry even if a newer
    # value replaced the one it saw.
    first_seq: int


class WriteBehind:
    """Coalescing, batching, retrying writer in front of a ``StateStore``.

    ``put``/``delete`` are plain functions for the event loop thread: they never
    block and never raise. Stats are plain attributes for an exporter to read:
    ``pending`` (keys not yet durable), ``written`` (key writes made durable),
    ``failures`` (failed store calls), ``dropped`` (writes discarded because the
    queue was full or the store rejected them as invalid), ``batches`` (batches
    attempted).
    """

    def __init__(
        self,
        store: StateStore,
        max_batch: int = 256,
        flush_interval_s: float = 0.05,
        *,
        max_pending: int = 100_000,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Wrap ``store``; call ``start()`` from a running event loop to begin writing.

        ``max_batch`` is capped by the store's ``max_txn_ops`` (one batch is one
        transaction). ``flush_interval_s`` is how long a first write waits for
        others to join its batch. ``sleep`` is used for retry backoff (injectable
        so tests can observe it).
        """
        self.store = store
        self.max_batch = max(1, min(max_batch, store.max_txn_ops))
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        ensure_registered(PENDING)
        QUEUE_LIMIT.labels("galaxy_store_pending_writes").set(max_pending)
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        # Insertion order is first_seq order: new keys go to the end, rewrites keep
        # their slot, and failed batches are put back at the front.
        self._pending: dict[str, _Entry] = {}
        self._inflight: dict[str, _Entry] = {}
        # Read at scrape time (a process runs one write-behind queue).
        PENDING.set_function(lambda: len(self._pending) + len(self._inflight))
        self._seq = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_ids = itertools.count()
        self._has_work = asyncio.Event()
        self._hurry = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._overflowing = False
        self.written = 0
        self.failures = 0
        self.dropped = 0
        self.batches = 0

    @property
    def pending(self) -> int:
        """Keys whose latest write is not durable yet (queued or being written)."""
        return len(self._pending) + len(self._inflight)

    # --- producer side (synchronous) ---------------------------------------

    def put(self, key: str, value: bytes) -> None:
        """Queue ``key = value``; replaces any queued write of the same key."""
        self._enqueue(key, value)

    def delete(self, key: str) -> None:
        """Queue deletion of ``key``; replaces any queued write of the same key."""
        self._enqueue(key, None)

    def _enqueue(self, key: str, value: bytes | None) -> None:
        self._seq += 1
        entry = self._pending.get(key)
        if entry is not None:
            entry.value = value
        elif self.pending >= self.max_pending:
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning(
                    "write-behind queue full (%d keys); dropping writes until it drains",
                    self.max_pending,
                )
            return
        else:
            self._pending[key] = _Entry(value, self._seq)
        if len(self._pending) >= self.max_batch:
            self._hurry.set()
        self._has_work.set()

    # --- flush / lifecycle ----------------------------------------------------

    def _durable_seq(self) -> int:
        """Every write with a sequence number <= this is durable (or dropped)."""
        oldest = self._seq + 1
        for queue in (self._inflight, self._pending):
            first = next(iter(queue.values()), None)
            if first is not None:
                oldest = min(oldest, first.first_seq)
        return oldest - 1

    def _release_waiters(self) -> None:
        durable = self._durable_seq()
        while self._waiters and self._waiters[0][0] <= durable:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)
        if self._overflowing and self.pending < self.max_pending:
            self._overflowing = False

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(error)

    async def flush(self) -> None:
        """Wait until every write queued before this call is durable.

        A key rewritten meanwhile counts once its newer value is durable. Writes
        that were dropped (see ``dropped``) do not hold a flush up. Raises
        ``RuntimeError`` if the writer is not running or is stopped meanwhile.
        While the store is down this waits for it to come back; wrap it in
        ``asyncio.wait_for`` to bound the wait.
        """
        target = self._seq
        if self._durable_seq() >= target:
            return
        if self._task is None or self._task.done():
            raise RuntimeError("WriteBehind is not running; call start() first")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (target, next(self._waiter_ids), fut))
        # Someone is waiting: skip the batching delay.
        self._hurry.set()
        await fut

    def start(self) -> None:
        """Start the background writer (idempotent). Needs a running loop."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="statestore-writebehind"
        )
        self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("write-behind task crashed", exc_info=task.exception())
            self._fail_waiters(RuntimeError("write-behind task crashed"))

    async def stop(self, flush: bool = True) -> None:
        """Stop the background writer, first flushing if ``flush`` is true.

        Unwritten entries stay queued (``pending``) and are written if the writer
        is started again.
        """
        task = self._task
        if task is None:
            return
        try:
            if flush and not task.done():
                await self.flush()
        finally:
            self._task = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._fail_waiters(RuntimeError("write-behind stopped before the flush completed"))

    # --- background writer ------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.initial_backoff_s
        try:
            while True:
                if not self._pending:
                    self._has_work.clear()
                    await self._has_work.wait()
                    continue
                if not self._hurry.is_set() and self.flush_interval_s > 0:
                    # Give concurrent writes a moment to join this batch (and coalesce).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), self.flush_interval_s)
                self._hurry.clear()
                while self._pending:
                    try:
                        await self._write_batch()
                    except StoreUnavailable as e:
                        self.failures += 1
                        self._requeue_inflight()
                        log.warning("state store unavailable, retrying in %.2fs: %s", backoff, e)
                        await self._sleep(backoff)
                        backoff = min(backoff * 2, self.max_backoff_s)
                        break
                    backoff = self.initial_backoff_s
        finally:
            # Cancelled mid-write: keep the entries for a later start().
            self._requeue_inflight()

    def _requeue_inflight(self) -> None:
        if not self._inflight:
            return
        merged: dict[str, _Entry] = {}
        for key, old in self._inflight.items():
            newer = self._pending.pop(key, None)
            # A newer queued value wins, but the older write's place (and first_seq)
            # is kept so a flush waiting for it still waits.
            merged[key] = _Entry(newer.value if newer else old.value, old.first_seq)
        merged.update(self._pending)
        self._pending = merged
        self._inflight = {}

    async def _write_batch(self) -> None:
        keys = list(itertools.islice(self._pending, self.max_batch))
        for key in keys:
            self._inflight[key] = self._pending.pop(key)
        self.batches += 1
        puts = [(k, e.value) for k, e in self._inflight.items() if e.value is not None]
        deletes = [k for k, e in self._inflight.items() if e.value is None]
        if puts:
            await self._write_group([k for k, _ in puts], self.store.put_many(puts))
        if deletes:
            await self._write_group(deletes, self.store.delete_many(deletes))

    async def _write_group(self, keys: list[str], call: Awaitable[int]) -> None:
        """Await one batch call; if the store rejects it, fall back to single writes."""
        try:
            await call
        except StoreUnavailable:
            raise
        except Exception:
            self.failures += 1
            log.exception("state store rejected a batch; writing its %d keys one by one", len(keys))
            await self._write_singly(keys)
        else:
            self._done(keys)

    async def _write_singly(self, keys: list[str]) -> None:
        """Isolate the entries the store rejects so one bad value cannot block the rest."""
        for key in keys:
            value = self._inflight[key].value
            try:
                if value is None:
                    await self.store.delete(key)
                else:
                    await self.store.put(key, value)
            except StoreUnavailable:
                raise
            except Exception:
                self.failures += 1
                self.dropped += 1
                log.exception("state store rejected write of %r; dropped", key)
                del self._inflight[key]
                self._release_waiters()
            else:
                self._done([key])

    def _done(self, keys: list[str]) -> None:
        for key in keys:
            del self._inflight[key]
        self.written += len(keys)
        self._release_waiters()
