"""Fixtures for the state store tests: every contract test runs on both backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from controlplane.runtime.clock import ManualClock
from statestore import EtcdStore, MemoryStore, StateStore
from tests.etcd_server import EtcdServer

# etcd applies lease expiry itself (checked every 500 ms); give it ample time.
ETCD_EXPIRY_WAIT_S = 10.0


@dataclass
class Backend:
    """A store under test plus the means to move its time forward."""

    kind: str
    store: StateStore
    prefix: str
    clock: ManualClock | None = None

    def key(self, name: str) -> str:
        """A key private to this test."""
        return f"{self.prefix}{name}"

    async def elapse(self, seconds: float) -> None:
        """Let ``seconds`` pass: instantly on the manual clock, really for etcd."""
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            # etcd runs on wall time; there is nothing to await but time itself.
            await asyncio.sleep(seconds)

    async def wait_absent(self, key: str) -> bool:
        """True once ``key`` is gone; for etcd, polls within a bounded time."""
        if self.clock is not None:
            return await self.store.get(key) is None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ETCD_EXPIRY_WAIT_S
        # etcd expires leases on its own schedule and tells nobody but watchers of
        # the key; polling an external process is the honest way to observe it.
        while loop.time() < deadline:
            if await self.store.get(key) is None:
                return True
            await asyncio.sleep(0.1)
        return False


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The store under test, with a unique key prefix; etcd keys are wiped afterwards."""
    prefix = f"/test/{uuid.uuid4().hex[:12]}/"
    if request.param == "memory":
        clock = ManualClock()
        memory = MemoryStore(clock=clock)
        yield Backend("memory", memory, prefix, clock)
        await memory.close()
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    etcd = EtcdStore([server.endpoint], timeout_s=5.0)
    try:
        yield Backend("etcd", etcd, prefix)
    finally:
        cleaner = EtcdStore([server.endpoint])
        try:
            await cleaner.delete_prefix(prefix)
        finally:
            await cleaner.close()
            await etcd.close()


@pytest.fixture
def store(backend: Backend) -> StateStore:
    """Just the store of ``backend``."""
    return backend.store
