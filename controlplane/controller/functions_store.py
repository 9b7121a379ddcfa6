"""Durable function specs in the state store, served from memory.

Deploy and delete are the only synchronous writes in Galaxy: a user is told
"deployed" only once the spec is durable. Reads (Dispatch fetching a spec on
a function's first request, `galaxy status`) are served from an in-memory
copy, so the dispatch path never waits on the store: with etcd down,
deployed functions keep serving and only deploy/delete fail (UNAVAILABLE).
The copy is filled by this controller's own writes and by reads that reach
the store; a controller taking over leadership fills it from the store.
"""

from __future__ import annotations

import asyncio

from controlplane.runtime import spec as specs
from controlplane.runtime import validation
from controlplane.runtime.errors import NotFound, Unavailable
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2
from statestore import StateStore, StoreUnavailable

PREFIX = "/galaxy/functions/"


class FunctionStore:
    """Function specs keyed by name, versioned by the store's revision.

    max_functions bounds how many functions the cluster holds (a deploy of a
    new name beyond it is RESOURCE_EXHAUSTED), which also bounds the size of
    a listing (see validation.MAX_MESSAGE_BYTES).
    """

    def __init__(
        self, store: StateStore, max_functions: int = validation.MAX_FUNCTIONS_DEFAULT
    ) -> None:
        self.store = store
        self.max_functions = max_functions
        self._deploying = asyncio.Lock()
        self._cache: dict[str, common_pb2.FunctionSpec] = {}
        # True once the whole prefix has been read: the cache is then a full
        # (possibly slightly stale) listing, good enough while the store is down.
        self._complete = False

    async def deploy(self, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
        """Validate, fill defaults, write durably; returns the stored spec."""
        stored = specs.with_defaults(spec)
        stored.version = 0
        # One deploy at a time, so two new names cannot both take the last place.
        async with self._deploying:
            if not self._complete:
                await self.list()  # fills the cache with every stored function
            if stored.name not in self._cache:
                validation.check_function_count(len(self._cache), self.max_functions)
            try:
                rev = await self.store.put(PREFIX + stored.name, stored.SerializeToString())
            except StoreUnavailable as e:
                raise Unavailable(f"state store unavailable, function not deployed: {e}") from e
        stored.version = rev
        self._cache[stored.name] = _copy(stored)
        return stored

    async def get(self, name: str) -> common_pb2.FunctionSpec:
        """The spec (from memory when known), or NotFound."""
        cached = self._cache.get(name)
        if cached is not None:
            return _copy(cached)
        try:
            kv = await self.store.get(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        if kv is None:
            raise NotFound(
                f"function {short(name)} not found; deploy it with `galaxy deploy -f SPEC`"
            )
        spec = _decode(kv.value, kv.version)
        self._cache[name] = spec
        return _copy(spec)

    async def list(self) -> list[common_pb2.FunctionSpec]:
        """All specs, sorted by name (from memory if the store is down)."""
        try:
            kvs = await self.store.get_prefix(PREFIX)
        except StoreUnavailable as e:
            if self._complete:
                return [_copy(self._cache[n]) for n in sorted(self._cache)]
            raise Unavailable(f"state store unavailable: {e}") from e
        out = [_decode(kv.value, kv.version) for kv in kvs]
        self._cache = {s.name: s for s in out}
        self._complete = True
        return [_copy(s) for s in out]

    async def delete(self, name: str) -> None:
        """Delete the spec, or NotFound."""
        try:
            deleted = await self.store.delete(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, function not deleted: {e}") from e
        self._cache.pop(name, None)
        if not deleted:
            raise NotFound(f"function {short(name)} not found")


def _decode(value: bytes, version: int) -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec.FromString(value)
    s.version = version
    return s


def _copy(spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
    # Callers may mutate what they get; the cache must not change with them.
    out = common_pb2.FunctionSpec()
    out.CopyFrom(spec)
    return out
