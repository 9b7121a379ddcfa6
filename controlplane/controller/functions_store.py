"""Durable function specs in the state store.

Deploy and delete are the only synchronous writes in Galaxy: a user is told
"deployed" only once the spec is durable.
"""

from __future__ import annotations

from controlplane import spec as specs
from controlplane.errors import NotFound, Unavailable
from galaxy.v1 import common_pb2
from statestore import StateStore, StoreUnavailable

PREFIX = "/galaxy/functions/"


class FunctionStore:
    """Function specs keyed by name, versioned by the store's revision."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def deploy(self, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
        """Validate, fill defaults, write durably; returns the stored spec."""
        stored = specs.with_defaults(spec)
        stored.version = 0
        try:
            rev = await self.store.put(PREFIX + stored.name, stored.SerializeToString())
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, function not deployed: {e}") from e
        stored.version = rev
        return stored

    async def get(self, name: str) -> common_pb2.FunctionSpec:
        """The stored spec, or NotFound."""
        try:
            kv = await self.store.get(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        if kv is None:
            raise NotFound(f"function {name!r} not found; deploy it with `galaxy deploy -f SPEC`")
        return _decode(kv.value, kv.version)

    async def list(self) -> list[common_pb2.FunctionSpec]:
        """All specs, sorted by name."""
        try:
            kvs = await self.store.get_prefix(PREFIX)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return [_decode(kv.value, kv.version) for kv in kvs]

    async def delete(self, name: str) -> None:
        """Delete the spec, or NotFound."""
        try:
            deleted = await self.store.delete(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, function not deleted: {e}") from e
        if not deleted:
            raise NotFound(f"function {name!r} not found")


def _decode(value: bytes, version: int) -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec.FromString(value)
    s.version = version
    return s
