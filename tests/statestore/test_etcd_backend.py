"""etcd-specific behaviour: URL parsing, outages, reconnection and endpoint failover."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from statestore import EtcdStore, MemoryStore, StoreUnavailable, open_store
from statestore.etcd import parse_endpoint
from tests.etcd_server import EtcdServer

WAIT_S = 10.0


async def test_open_store_urls() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    store = open_store("etcd://10.0.0.1:2379,etcd-b:32379")
    assert isinstance(store, EtcdStore)
    assert store.endpoint == "10.0.0.1:2379"
    await store.close()
    for bad in ["redis://x:1", "etcd://", "memory://somewhere", "127.0.0.1:2379", "etcd://h:port"]:
        with pytest.raises(ValueError) as err:
            open_store(bad)
        if "://" not in bad or bad.startswith("redis"):
            assert "memory://" in str(err.value) and "etcd://host:port" in str(err.value)


def test_parse_endpoint() -> None:
    assert parse_endpoint("example:1234") == ("example", 1234)
    assert parse_endpoint("example") == ("example", 2379)
    assert parse_endpoint("[::1]:2380") == ("[::1]", 2380)
    with pytest.raises(ValueError):
        parse_endpoint("host:notaport")


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
@pytest.mark.etcd
async def test_outage_raises_store_unavailable_then_recovers(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "etcd")
    await asyncio.to_thread(server.start)
    store = EtcdStore([server.endpoint], timeout_s=2.0)
    try:
        await store.put("/o/k", b"1")
        async with store.watch_prefix("/o/") as watch:
            await asyncio.to_thread(server.stop)
            with pytest.raises(StoreUnavailable):
                await asyncio.wait_for(anext(watch), WAIT_S)
            with pytest.raises(StoreUnavailable):
                await asyncio.wait_for(store.get("/o/k"), WAIT_S)
        await asyncio.to_thread(server.start)
        # gRPC reconnects on its own (backoff capped at 1 s); the first calls
        # after the restart may still fail while it does.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            try:
                kv = await store.get("/o/k")
                break
            except StoreUnavailable:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        assert kv is not None and kv.value == b"1"
        # A new watch works on the reconnected channel.
        async with store.watch_prefix("/o/") as watch:
            await store.put("/o/k", b"2")
            event = await asyncio.wait_for(anext(watch), WAIT_S)
            assert (event.key, event.value) == ("/o/k", b"2")
    finally:
        await store.close()
        await asyncio.to_thread(server.stop)


@pytest.mark.etcd
async def test_fails_over_to_next_endpoint(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{_unused_port()}"
    store = EtcdStore([dead, etcd_server.endpoint], timeout_s=2.0)
    try:
        with pytest.raises(StoreUnavailable):
            await store.put("/failover/k", b"v")
        assert store.endpoint == etcd_server.endpoint
        assert await store.put("/failover/k", b"v") > 0
    finally:
        await store.delete_prefix("/failover/")
        await store.close()


async def test_unreachable_endpoint_raises_store_unavailable() -> None:
    store = EtcdStore([f"127.0.0.1:{_unused_port()}"], timeout_s=2.0)
    try:
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.get("/k"), WAIT_S)
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.watch_prefix("/k").started(), WAIT_S)
    finally:
        await store.close()
