"""Serving runtimes in the state store (``/galaxy/runtimes/NAME``).

Runtimes are read only when a function is deployed, which writes to the
store anyway, so every read goes to the store: no cache to keep right
across leader changes. A put of an unchanged runtime writes nothing (``galaxy
up`` registers its built-in runtimes on every start).
"""

from __future__ import annotations

import asyncio

from controlplane.controller.keyed_store import KeyedRecords, unchanged
from controlplane.runtime import servingruntime
from controlplane.runtime.errors import NotFound, ResourceExhausted
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2
from statestore import StateStore

PREFIX = "/galaxy/runtimes/"


class RuntimeStore:
    """ServingRuntimes keyed by name, versioned by the store's revision.

    ``lock`` is held by the controller around resolving a deploy and around
    a delete, so a runtime cannot go between a deploy's check and its write.
    """

    def __init__(self, store: StateStore, max_runtimes: int = servingruntime.MAX_RUNTIMES) -> None:
        self.store = store
        self.records = KeyedRecords(store, PREFIX, "runtime", common_pb2.ServingRuntime.FromString)
        self.max_runtimes = max_runtimes
        self.lock = asyncio.Lock()

    async def put(self, rt: common_pb2.ServingRuntime) -> common_pb2.ServingRuntime:
        """Check and store rt; returns it with its version."""
        stored = common_pb2.ServingRuntime()
        stored.CopyFrom(rt)
        stored.version = 0
        servingruntime.check_runtime(stored)
        async with self.lock:
            current = await self._get(stored.name)
            if unchanged(current, stored):
                return stored  # nothing to write
            if current is None and (n := len(await self._list())) >= self.max_runtimes:
                raise ResourceExhausted(
                    f"runtimes: the cluster holds {n} runtimes, at most {self.max_runtimes} "
                    "allowed; delete one first"
                )
            stored.version = await self.records.write(stored.name, stored)
        return stored

    async def get(self, name: str) -> common_pb2.ServingRuntime:
        """The runtime, or NotFound."""
        rt = await self._get(name)
        if rt is None:
            raise NotFound(
                f"runtime {short(name)} not found; see `galaxy runtimes list`, or register "
                "one with `galaxy runtimes apply -f FILE`"
            )
        return rt

    async def find(self, name: str) -> common_pb2.ServingRuntime | None:
        """The runtime, or None when no runtime has that name."""
        return await self._get(name)

    async def _get(self, name: str) -> common_pb2.ServingRuntime | None:
        return await self.records.find(name)

    async def _list(self) -> list[common_pb2.ServingRuntime]:
        return await self.records.every()

    async def delete(self, name: str) -> None:
        """Delete the runtime, or NotFound (the caller checks it is unused)."""
        await self.records.remove(name)

    # Last: the name shadows the builtin in annotations below it.
    async def list(self) -> list[common_pb2.ServingRuntime]:
        """Every runtime, sorted by name."""
        return sorted(await self._list(), key=lambda r: r.name)
