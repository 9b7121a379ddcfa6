"""WriteBehind: coalescing, flush semantics, batching, retries, and a real etcd outage."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from statestore import EtcdStore, MemoryStore, StoreUnavailable, WriteBehind
from tests.etcd_server import EtcdServer

WAIT_S = 10.0


class RecordingStore(MemoryStore):
    """A real MemoryStore that records batch calls and can hold or fail them.

    Each ``put_many`` call announces itself on ``entered`` and, if ``gates`` is not
    empty, waits for the next gate in line before writing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.put_many_calls: list[list[tuple[str, bytes]]] = []
        self.delete_many_calls: list[list[str]] = []
        self.entered: asyncio.Queue[list[tuple[str, bytes]]] = asyncio.Queue()
        self.gates: deque[asyncio.Event] = deque()
        self.fail_next = 0

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> int:
        self.put_many_calls.append(list(items))
        self.entered.put_nowait(list(items))
        if self.gates:
            await self.gates.popleft().wait()
        # A real store call always yields to the loop; model that, so other tasks
        # can observe the state while a batch is in flight.
        await asyncio.sleep(0)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StoreUnavailable("injected outage")
        return await super().put_many(items)

    async def delete_many(self, keys: Sequence[str]) -> int:
        self.delete_many_calls.append(list(keys))
        await asyncio.sleep(0)
        return await super().delete_many(keys)


@pytest.fixture
async def recording() -> AsyncIterator[RecordingStore]:
    store = RecordingStore()
    yield store
    await store.close()


async def value(store: MemoryStore | EtcdStore, key: str) -> bytes | None:
    kv = await store.get(key)
    return None if kv is None else kv.value


async def test_coalesces_repeated_writes(recording: RecordingStore) -> None:
    wb = WriteBehind(recording, flush_interval_s=0.01)
    wb.start()
    try:
        for i in range(100):
            wb.put("k1", f"v{i}".encode())
        wb.put("k2", b"x")
        wb.put("gone", b"y")
        wb.delete("gone")
        assert wb.pending == 3
        await asyncio.wait_for(wb.flush(), WAIT_S)
    finally:
        await wb.stop()
    assert await value(recording, "k1") == b"v99"
    assert await value(recording, "k2") == b"x"
    assert await value(recording, "gone") is None
    assert recording.put_many_calls == [[("k1", b"v99"), ("k2", b"x")]]
    assert recording.delete_many_calls == [["gone"]]
    assert (wb.pending, wb.written, wb.failures, wb.dropped) == (0, 3, 0, 0)


async def test_flush_returns_only_when_durable(recording: RecordingStore) -> None:
    gate = asyncio.Event()
    recording.gates.append(gate)
    wb = WriteBehind(recording, flush_interval_s=0)
    wb.start()
    try:
        wb.put("k", b"v1")
        flushing = asyncio.ensure_future(wb.flush())
        assert await asyncio.wait_for(recording.entered.get(), WAIT_S) == [("k", b"v1")]
        # The batch is in the store call but not finished: flush must still wait.
        assert not flushing.done()
        assert await value(recording, "k") is None
        wb.put("k", b"v2")  # after the flush call: not covered by it
        gate.set()
        await asyncio.wait_for(flushing, WAIT_S)
        assert await value(recording, "k") in (b"v1", b"v2")
        await asyncio.wait_for(wb.flush(), WAIT_S)
        assert await value(recording, "k") == b"v2"
    finally:
        gate.set()
        await wb.stop()


async def test_flush_waits_for_newer_value_of_a_covered_key(recording: RecordingStore) -> None:
    first, second = asyncio.Event(), asyncio.Event()
    recording.gates.extend([first, second])
    wb = WriteBehind(recording, flush_interval_s=0)
    wb.start()
    try:
        # Hold the writer inside a first batch so the queue below stays put.
        wb.put("blocker", b"b")
        await asyncio.wait_for(recording.entered.get(), WAIT_S)
        wb.put("k", b"old")
        flushing = asyncio.ensure_future(wb.flush())
        await asyncio.sleep(0)  # let the flush task run up to its wait
        assert len(wb._waiters) == 1 and not flushing.done()
        # Rewritten after the flush call: the old value is never sent, so the
        # flush is only satisfied once the newer value is durable.
        wb.put("k", b"new")
        first.set()
        assert await asyncio.wait_for(recording.entered.get(), WAIT_S) == [("k", b"new")]
        assert not flushing.done()
        second.set()
        await asyncio.wait_for(flushing, WAIT_S)
        assert await value(recording, "k") == b"new"
    finally:
        first.set()
        second.set()
        await wb.stop()


async def test_flush_with_nothing_pending_and_when_not_running(recording: RecordingStore) -> None:
    wb = WriteBehind(recording)
    await asyncio.wait_for(wb.flush(), WAIT_S)  # nothing queued: returns at once
    wb.put("k", b"v")
    with pytest.raises(RuntimeError, match="not running"):
        await wb.flush()
    wb.start()
    await asyncio.wait_for(wb.stop(flush=True), WAIT_S)
    assert await value(recording, "k") == b"v"


async def test_batches_are_bounded(recording: RecordingStore) -> None:
    wb = WriteBehind(recording, max_batch=100, flush_interval_s=0)
    for i in range(1000):
        wb.put(f"key/{i:04d}", b"v")
    wb.start()
    try:
        await asyncio.wait_for(wb.flush(), WAIT_S)
    finally:
        await wb.stop()
    assert [len(c) for c in recording.put_many_calls] == [100] * 10
    assert len(await recording.get_prefix("key/")) == 1000
    assert (wb.pending, wb.written, wb.batches) == (0, 1000, 10)


def test_max_batch_is_capped_by_store_txn_limit() -> None:
    assert WriteBehind(MemoryStore(max_txn_ops=128), max_batch=256).max_batch == 128
    assert WriteBehind(MemoryStore(max_txn_ops=128), max_batch=10).max_batch == 10


def test_put_and_delete_never_raise_and_overflow_is_counted() -> None:
    wb = WriteBehind(MemoryStore(), max_pending=3)
    for i in range(5):
        wb.put(f"k{i}", b"v")
    wb.put("k0", b"rewrite")  # an already queued key is not a new entry
    wb.delete("k1")
    assert (wb.pending, wb.dropped) == (3, 2)


async def test_retries_with_capped_backoff(recording: RecordingStore) -> None:
    delays: list[float] = []

    async def record_sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    recording.fail_next = 5
    wb = WriteBehind(
        recording,
        flush_interval_s=0,
        initial_backoff_s=0.05,
        max_backoff_s=0.2,
        sleep=record_sleep,
    )
    wb.start()
    try:
        wb.put("k", b"v1")
        wb.put("k", b"v2")
        await asyncio.wait_for(wb.flush(), WAIT_S)
    finally:
        await wb.stop()
    assert delays == [0.05, 0.1, 0.2, 0.2, 0.2]
    assert (wb.failures, wb.written, wb.pending) == (5, 1, 0)
    assert await value(recording, "k") == b"v2"


async def test_rejected_entry_is_dropped_not_retried(recording: RecordingStore) -> None:
    wb = WriteBehind(recording, flush_interval_s=0)
    wb.start()
    try:
        wb.put("", b"empty keys are invalid")
        wb.put("good", b"v")
        await asyncio.wait_for(wb.flush(), WAIT_S)
    finally:
        await wb.stop()
    assert await value(recording, "good") == b"v"
    assert (wb.dropped, wb.written, wb.pending) == (1, 1, 0)


async def test_stop_without_flush_keeps_entries_for_restart(recording: RecordingStore) -> None:
    gate = asyncio.Event()
    recording.gates.append(gate)
    wb = WriteBehind(recording, flush_interval_s=0)
    wb.start()
    wb.put("k", b"v")
    await asyncio.wait_for(recording.entered.get(), WAIT_S)
    await asyncio.wait_for(wb.stop(flush=False), WAIT_S)
    assert wb.pending == 1 and await value(recording, "k") is None
    wb.start()
    await asyncio.wait_for(wb.stop(flush=True), WAIT_S)
    assert wb.pending == 0 and await value(recording, "k") == b"v"


@pytest.mark.slow
@pytest.mark.etcd
async def test_survives_etcd_outage(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "etcd-outage")
    await asyncio.to_thread(server.start)
    store = EtcdStore([server.endpoint], timeout_s=2.0)
    retrying = asyncio.Event()

    async def observed_sleep(seconds: float) -> None:
        retrying.set()
        await asyncio.sleep(seconds)

    wb = WriteBehind(store, flush_interval_s=0.01, max_backoff_s=0.5, sleep=observed_sleep)
    wb.start()
    try:
        wb.put("/wb/before", b"1")
        await asyncio.wait_for(wb.flush(), WAIT_S)
        assert await value(store, "/wb/before") == b"1"

        await asyncio.to_thread(server.stop)
        # Enqueueing is synchronous and independent of the store being down.
        for i in range(300):
            wb.put(f"/wb/k{i % 50}", f"v{i}".encode())
        wb.delete("/wb/before")
        assert wb.pending == 51
        await asyncio.wait_for(retrying.wait(), WAIT_S)
        assert wb.failures >= 1 and wb.pending == 51

        await asyncio.to_thread(server.start)
        await asyncio.wait_for(wb.flush(), 30.0)
        assert wb.pending == 0
        got = {kv.key: kv.value for kv in await store.get_prefix("/wb/")}
        assert got == {f"/wb/k{i}": f"v{250 + i}".encode() for i in range(50)}
    finally:
        await wb.stop(flush=False)
        await store.close()
        await asyncio.to_thread(server.stop)
