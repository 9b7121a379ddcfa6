"""One behavioural contract, run against MemoryStore and a real etcd."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from statestore import EventType, LeaseNotFound, MemoryStore, StoreError, Watch, WatchEvent

if TYPE_CHECKING:
    from tests.statestore.conftest import Backend

EVENT_TIMEOUT_S = 5.0


async def next_event(watch: Watch) -> WatchEvent:
    return await asyncio.wait_for(anext(watch), EVENT_TIMEOUT_S)


async def test_put_get_delete(backend: Backend) -> None:
    store, k = backend.store, backend.key("a")
    assert await store.get(k) is None
    rev = await store.put(k, b"one")
    assert rev > 0
    kv = await store.get(k)
    assert kv is not None
    assert (kv.key, kv.value, kv.version) == (k, b"one", rev)
    assert await store.delete(k) is True
    assert await store.get(k) is None
    assert await store.delete(k) is False


async def test_versions_increase_across_keys(backend: Backend) -> None:
    store = backend.store
    a, b = backend.key("a"), backend.key("b")
    r1 = await store.put(a, b"1")
    r2 = await store.put(b, b"1")
    r3 = await store.put(a, b"2")
    assert r1 < r2 < r3
    got_a, got_b = await store.get(a), await store.get(b)
    assert got_a is not None and got_a.version == r3 and got_a.value == b"2"
    assert got_b is not None and got_b.version == r2


async def test_get_prefix_sorted_and_scoped(backend: Backend) -> None:
    store = backend.store
    inside = ["items/c", "items/a", "items/b/1", "items/b"]
    for i, name in enumerate(inside):
        await store.put(backend.key(name), str(i).encode())
    # Neighbours that share the text but not the prefix "items/".
    await store.put(backend.key("items"), b"x")
    await store.put(backend.key("itemsz"), b"x")
    await store.put(backend.key("other/a"), b"x")
    got = await store.get_prefix(backend.key("items/"))
    assert [kv.key for kv in got] == [backend.key(n) for n in sorted(inside)]
    assert got[0].value == b"1"  # items/a was written second
    assert await store.get_prefix(backend.key("nothing/")) == []


async def test_delete_prefix(backend: Backend) -> None:
    store = backend.store
    for name in ["d/1", "d/2", "d/3/x"]:
        await store.put(backend.key(name), b"v")
    await store.put(backend.key("dd"), b"keep")
    assert await store.delete_prefix(backend.key("d/")) == 3
    assert await store.get_prefix(backend.key("d/")) == []
    kept = await store.get(backend.key("dd"))
    assert kept is not None and kept.value == b"keep"
    assert await store.delete_prefix(backend.key("d/")) == 0


async def test_delete_many_counts_existing_keys(backend: Backend) -> None:
    store = backend.store
    a, b, c = backend.key("a"), backend.key("b"), backend.key("c")
    await store.put(a, b"1")
    await store.put(b, b"2")
    assert await store.delete_many([a, b, c, a]) == 2
    assert await store.get(a) is None and await store.get(b) is None
    assert await store.delete_many([]) == 0


async def test_compare_and_swap(backend: Backend) -> None:
    store, k = backend.store, backend.key("cas")
    # Create-if-absent.
    assert await store.compare_and_swap(k, 0, b"v1") is True
    first = await store.get(k)
    assert first is not None and first.value == b"v1"
    assert await store.compare_and_swap(k, 0, b"again") is False
    # Wrong version: no change.
    assert await store.compare_and_swap(k, first.version + 1000, b"nope") is False
    unchanged = await store.get(k)
    assert unchanged == first
    # Right version.
    assert await store.compare_and_swap(k, first.version, b"v2") is True
    second = await store.get(k)
    assert second is not None and second.value == b"v2" and second.version > first.version
    # A stale version loses after someone else wrote.
    await store.put(k, b"other")
    assert await store.compare_and_swap(k, second.version, b"stale") is False
    # After deletion only create-if-absent works.
    await store.delete(k)
    assert await store.compare_and_swap(k, second.version, b"x") is False
    assert await store.compare_and_swap(k, 0, b"recreated") is True


async def test_put_many_is_one_atomic_revision(backend: Backend) -> None:
    store = backend.store
    keys = [backend.key(f"batch/{i}") for i in range(3)]
    async with store.watch_prefix(backend.key("batch/")) as watch:
        rev = await store.put_many([(k, f"v{i}".encode()) for i, k in enumerate(keys)])
        events = [await next_event(watch) for _ in keys]
    # One transaction: every key carries the same, returned revision, and the
    # watch saw the writes as a single revision.
    got = await store.get_prefix(backend.key("batch/"))
    assert [(kv.key, kv.value, kv.version) for kv in got] == [
        (k, f"v{i}".encode(), rev) for i, k in enumerate(keys)
    ]
    assert {e.version for e in events} == {rev}
    assert sorted(e.key for e in events) == keys


async def test_put_many_last_value_wins_and_limit(backend: Backend) -> None:
    store, k = backend.store, backend.key("dup")
    await store.put_many([(k, b"first"), (k, b"last")])
    kv = await store.get(k)
    assert kv is not None and kv.value == b"last"
    too_many = [(backend.key(f"n/{i}"), b"v") for i in range(store.max_txn_ops + 1)]
    with pytest.raises(ValueError, match="max_txn_ops"):
        await store.put_many(too_many)
    assert await store.get_prefix(backend.key("n/")) == []


@pytest.mark.slow
async def test_lease_expiry_removes_only_leased_keys(backend: Backend) -> None:
    store = backend.store
    leased, plain = backend.key("leased"), backend.key("plain")
    lease = await store.grant_lease(1.0)
    await store.put(leased, b"alive", lease=lease)
    await store.put(plain, b"stays")
    assert await store.get(leased) is not None
    await backend.elapse(1.0)
    assert await backend.wait_absent(leased)
    assert await store.get(plain) is not None
    with pytest.raises(LeaseNotFound):
        await store.refresh_lease(lease)


@pytest.mark.slow
async def test_watch_sees_lease_expiry_as_delete(backend: Backend) -> None:
    store, k = backend.store, backend.key("hb/node1")
    lease = await store.grant_lease(1.0)
    rev = await store.put(k, b"alive", lease=lease)
    async with store.watch_prefix(backend.key("hb/")) as watch:
        await backend.elapse(1.0)
        assert await backend.wait_absent(k)
        event = await next_event(watch)
    assert (event.type, event.key, event.value) == (EventType.DELETE, k, b"")
    assert event.version > rev


@pytest.mark.slow
async def test_refresh_keeps_lease_alive(backend: Backend) -> None:
    store, k = backend.store, backend.key("kept")
    lease = await store.grant_lease(2.0)
    await store.put(k, b"v", lease=lease)
    await backend.elapse(1.2)
    await store.refresh_lease(lease)
    await backend.elapse(1.2)
    # 2.4 s after the grant but only 1.2 s after the refresh.
    assert await store.get(k) is not None
    await backend.elapse(1.0)
    assert await backend.wait_absent(k)


async def test_revoke_deletes_keys_and_is_idempotent(backend: Backend) -> None:
    store, k = backend.store, backend.key("revoked")
    lease = await store.grant_lease(30)
    await store.put(k, b"v", lease=lease)
    await store.revoke_lease(lease)
    assert await store.get(k) is None
    await store.revoke_lease(lease)
    with pytest.raises(LeaseNotFound):
        await store.refresh_lease(lease)


async def test_unknown_lease(backend: Backend) -> None:
    store = backend.store
    with pytest.raises(LeaseNotFound):
        await store.refresh_lease(987654321)
    with pytest.raises(LeaseNotFound):
        await store.put(backend.key("x"), b"v", lease=987654321)
    with pytest.raises(LeaseNotFound):
        await store.compare_and_swap(backend.key("x"), 0, b"v", lease=987654321)
    assert await store.get(backend.key("x")) is None


async def test_put_without_lease_detaches_it(backend: Backend) -> None:
    store, k = backend.store, backend.key("detach")
    lease = await store.grant_lease(30)
    await store.put(k, b"leased", lease=lease)
    await store.put(k, b"plain")
    await store.revoke_lease(lease)
    kv = await store.get(k)
    assert kv is not None and kv.value == b"plain"


async def test_watch_prefix_delivers_in_order_and_scoped(backend: Backend) -> None:
    store = backend.store
    a, b = backend.key("w/a"), backend.key("w/b")
    await store.put(a, b"before")  # before the watch: not delivered
    async with store.watch_prefix(backend.key("w/")) as watch:
        r1 = await store.put(a, b"1")
        await store.put(backend.key("elsewhere"), b"x")
        await store.put(backend.key("w"), b"x")
        r2 = await store.put(b, b"2")
        r3 = await store.put(a, b"3")
        await store.delete(a)
        events = [await next_event(watch) for _ in range(4)]
    assert [(e.type, e.key, e.value) for e in events] == [
        (EventType.PUT, a, b"1"),
        (EventType.PUT, b, b"2"),
        (EventType.PUT, a, b"3"),
        (EventType.DELETE, a, b""),
    ]
    assert [e.version for e in events[:3]] == [r1, r2, r3]
    assert events[3].version > r3


async def test_watch_ends_after_aclose(backend: Backend) -> None:
    watch = backend.store.watch_prefix(backend.key("c/"))
    await watch.started()
    await backend.store.put(backend.key("c/1"), b"v")
    assert (await next_event(watch)).key == backend.key("c/1")
    await watch.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(watch), EVENT_TIMEOUT_S)


async def test_watch_ends_when_store_closes(backend: Backend) -> None:
    watch = backend.store.watch_prefix(backend.key("s/"))
    await watch.started()
    waiter = asyncio.ensure_future(anext(watch))
    await backend.store.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, EVENT_TIMEOUT_S)
    with pytest.raises(StoreError):
        await backend.store.get(backend.key("s/1"))


async def test_binary_values_round_trip(backend: Backend) -> None:
    store = backend.store
    blob = bytes(range(256)) + b"\x00\xff\x00"
    k1, k2 = backend.key("bin/1"), backend.key("bin/\u00e9\u4e2d")
    async with store.watch_prefix(backend.key("bin/")) as watch:
        await store.put(k1, blob)
        await store.put_many([(k2, blob[::-1])])
        events = [await next_event(watch) for _ in range(2)]
    kv = await store.get(k1)
    assert kv is not None and kv.value == blob
    assert [(kv.key, kv.value) for kv in await store.get_prefix(backend.key("bin/"))] == [
        (k1, blob),
        (k2, blob[::-1]),
    ]
    assert [(e.key, e.value) for e in events] == [(k1, blob), (k2, blob[::-1])]
    assert await store.put(backend.key("empty"), b"") > 0
    empty = await store.get(backend.key("empty"))
    assert empty is not None and empty.value == b""


async def test_empty_key_rejected(backend: Backend) -> None:
    with pytest.raises(ValueError):
        await backend.store.put("", b"v")
    with pytest.raises(ValueError):
        await backend.store.get_prefix("")


async def test_memory_store_expires_idle_leases_on_real_time() -> None:
    # With the default real clock a timer revokes the lease even if nobody calls
    # the store, so a watcher learns about a dead holder without polling.
    store = MemoryStore()
    try:
        lease = await store.grant_lease(0.05)
        await store.put("/hb/n", b"alive", lease=lease)
        async with store.watch_prefix("/hb/") as watch:
            event = await next_event(watch)
        assert (event.type, event.key) == (EventType.DELETE, "/hb/n")
    finally:
        await store.close()
