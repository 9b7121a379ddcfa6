"""The runtime store on both backends (memory and a real etcd): what is put
is read back from the store with its version, an unchanged put writes
nothing, the count is bounded, and the key is /galaxy/runtimes/NAME."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from controlplane.controller.runtimes_store import PREFIX, RuntimeStore
from controlplane.runtime.errors import InvalidArgument, NotFound, ResourceExhausted
from galaxy.v1 import common_pb2
from statestore import StateStore
from statestore.etcd import EtcdStore
from statestore.memory import MemoryStore
from tests.etcd_server import EtcdServer


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.close()
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    etcd = EtcdStore([server.endpoint], timeout_s=5.0)
    try:
        yield etcd
    finally:
        await etcd.close()


def _rt(name: str, *command: str) -> common_pb2.ServingRuntime:
    return common_pb2.ServingRuntime(name=name, command=list(command) or ["srv"])


async def test_put_get_list_delete(store: StateStore) -> None:
    runtimes = RuntimeStore(store, max_runtimes=1000)
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    try:
        first = await runtimes.put(_rt(a))
        assert first.version > 0
        kv = await store.get(PREFIX + a)
        assert kv is not None and common_pb2.ServingRuntime.FromString(kv.value).name == a
        assert (await runtimes.put(_rt(a))).version == first.version  # nothing written
        changed = await runtimes.put(_rt(a, "srv", "--v2"))
        assert changed.version > first.version
        assert list((await runtimes.get(a)).command) == ["srv", "--v2"]
        await runtimes.put(_rt(b))
        names = [r.name for r in await runtimes.list()]
        assert names.index(a) < names.index(b)
        await runtimes.delete(a)
        with pytest.raises(NotFound):
            await runtimes.get(a)
        with pytest.raises(NotFound):
            await runtimes.delete(a)
        assert await runtimes.find(a) is None
    finally:
        await store.delete_many([PREFIX + a, PREFIX + b])


async def test_the_count_is_bounded_and_bad_runtimes_are_not_stored(store: StateStore) -> None:
    runtimes = RuntimeStore(store)
    have = len(await runtimes.list())
    runtimes.max_runtimes = have + 1
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    try:
        await runtimes.put(_rt(a))
        with pytest.raises(ResourceExhausted, match=r"^runtimes: the cluster holds"):
            await runtimes.put(_rt(b))
        await runtimes.put(_rt(a, "srv", "-v"))  # replacing one is not a new one
        with pytest.raises(InvalidArgument, match=r"^command\[0\]: must be the program"):
            await runtimes.put(_rt(b, "{artifact}"))
        assert await store.get(PREFIX + b) is None
    finally:
        await store.delete_many([PREFIX + a, PREFIX + b])
