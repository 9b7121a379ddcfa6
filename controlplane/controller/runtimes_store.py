"""Serving runtimes in the state store (``/galaxy/runtimes/NAME``).

Runtimes are read only when a function is deployed, which writes to the
store anyway, so every read goes to the store: no cache to keep right
across leader changes. A put of an unchanged runtime writes nothing (``galaxy
up`` registers its built-in runtimes on every start).
"""

from __future__ import annotations

import asyncio

from controlplane.runtime import servingruntime
from controlplane.runtime.errors import NotFound, ResourceExhausted, Unavailable
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2
from statestore import StateStore, StoreUnavailable

PREFIX = "/galaxy/runtimes/"


class RuntimeStore:
    """ServingRuntimes keyed by name, versioned by the store's revision.

    ``lock`` is held by the controller around resolving a deploy and around
    a delete, so a runtime cannot go between a deploy's check and its write.
    """

    def __init__(self, store: StateStore, max_runtimes: int = servingruntime.MAX_RUNTIMES) -> None:
        self.store = store
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
            if current is not None:
                version = current.version
                current.version = 0
                if current == stored:
                    stored.version = version
                    return stored  # unchanged: nothing to write
            elif (n := len(await self._list())) >= self.max_runtimes:
                raise ResourceExhausted(
                    f"runtimes: the cluster holds {n} runtimes, at most {self.max_runtimes} "
                    "allowed; delete one first"
                )
            try:
                stored.version = await self.store.put(
                    PREFIX + stored.name, stored.SerializeToString()
                )
            except StoreUnavailable as e:
                raise Unavailable(f"state store unavailable, runtime not stored: {e}") from e
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
        try:
            kv = await self.store.get(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return None if kv is None else _decode(kv.value, kv.version)

    async def _list(self) -> list[common_pb2.ServingRuntime]:
        try:
            kvs = await self.store.get_prefix(PREFIX)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return [_decode(kv.value, kv.version) for kv in kvs]

    async def delete(self, name: str) -> None:
        """Delete the runtime, or NotFound (the caller checks it is unused)."""
        try:
            deleted = await self.store.delete(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, runtime not deleted: {e}") from e
        if not deleted:
            raise NotFound(f"runtime {short(name)} not found")

    # Last: the name shadows the builtin in annotations below it.
    async def list(self) -> list[common_pb2.ServingRuntime]:
        """Every runtime, sorted by name."""
        return sorted(await self._list(), key=lambda r: r.name)


def _decode(value: bytes, version: int) -> common_pb2.ServingRuntime:
    rt = common_pb2.ServingRuntime.FromString(value)
    rt.version = version
    return rt
