"""Records that expire with their writer (``LeasedStore``), on both backends."""

from __future__ import annotations

import asyncio

import pytest

from statestore import LeaseNotFound, WriteBehind
from statestore.leased import LeasedStore
from tests.statestore.conftest import Backend


async def _eventually_present(backend: Backend, key: str, timeout_s: float = 10.0) -> bool:
    # The keeper runs on real time on both backends; poll within a bound.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await backend.store.get(key) is not None:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.slow
async def test_put_many_attaches_every_key_to_the_lease(backend: Backend) -> None:
    store = backend.store
    a, b, plain = backend.key("a"), backend.key("b"), backend.key("plain")
    lease = await store.grant_lease(1.0)
    await store.put_many([(a, b"1"), (b, b"2")], lease=lease)
    await store.put(plain, b"stays")
    with pytest.raises(LeaseNotFound):
        await store.put_many([(backend.key("c"), b"3")], lease=lease + 10_000)
    assert await store.get(backend.key("c")) is None  # nothing of a refused batch
    await backend.elapse(1.5)
    assert await backend.wait_absent(a) and await backend.wait_absent(b)
    assert await store.get(plain) is not None


@pytest.mark.slow
async def test_a_dead_writers_records_expire(backend: Backend) -> None:
    leased = LeasedStore(backend.store, ttl_s=1.0)
    writer = WriteBehind(leased, flush_interval_s=0.0)
    writer.start()
    keys = [backend.key(f"inst-{i}") for i in range(5)]
    for k in keys:
        writer.put(k, b"10.0.0.1:8080")
    await writer.flush()
    assert all([await backend.store.get(k) is not None for k in keys])
    # A crash: the keeper stops, nothing revokes the lease.
    await writer.stop(flush=False)
    leased.abandon()
    await backend.elapse(1.5)
    for k in keys:
        assert await backend.wait_absent(k)


async def test_a_lost_lease_is_renewed_and_the_records_written_again(backend: Backend) -> None:
    leased = LeasedStore(backend.store, ttl_s=1.5)
    k = backend.key("node-1")
    await leased.put(k, b"status")
    first = leased.lease_id
    assert first is not None
    # The lease ends while the writer lives (as after a long store outage).
    await backend.store.revoke_lease(first)
    assert await backend.store.get(k) is None
    assert await _eventually_present(backend, k)
    # The record can be read back before the writer's own put returns and
    # counts it: wait for the count, within a bound, as for the record.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while loop.time() < deadline:
        if leased.restored >= 1:
            break
        await asyncio.sleep(0.01)
    assert leased.lease_id not in (None, first)
    assert (leased.lost, leased.restored) == (1, 1)
    # Deleted records are not brought back.
    await leased.delete(k)
    await leased.revoke_lease(leased.lease_id)  # type: ignore[arg-type]
    leased.abandon()


async def test_a_revoking_stop_removes_the_records_at_once(backend: Backend) -> None:
    leased = LeasedStore(backend.store, ttl_s=30.0)
    k = backend.key("inst")
    await leased.put_many([(k, b"v")])
    lease = leased.lease_id
    assert lease is not None
    # close() revokes the lease, then closes the inner store: use a fresh
    # wrapper around the same backend so the fixture's store stays open.
    leased.inner = _NoClose(backend.store)  # type: ignore[assignment]
    await leased.close(revoke=True)
    assert await backend.store.get(k) is None


@pytest.mark.slow
@pytest.mark.etcd
async def test_records_live_as_long_as_the_writer(etcd_server) -> None:  # type: ignore[no-untyped-def]
    from statestore import EtcdStore

    store = EtcdStore([etcd_server.endpoint])
    leased = LeasedStore(store, ttl_s=1.0)
    try:
        await leased.put("/test/leased/alive", b"v")
        # Three TTLs on etcd's own clock: the keeper's refreshes keep it.
        await asyncio.sleep(3.0)
        assert await store.get("/test/leased/alive") is not None
    finally:
        await leased.close()  # stops keeping the lease: gone within the TTL
    check = EtcdStore([etcd_server.endpoint])
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        gone = False
        while loop.time() < deadline:  # etcd expires leases on its own schedule
            if await check.get("/test/leased/alive") is None:
                gone = True
                break
            await asyncio.sleep(0.1)
        assert gone
    finally:
        await check.close()


class _NoClose:
    """Delegates to a store but leaves it open on close()."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def close(self) -> None:
        return None
