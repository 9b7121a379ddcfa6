"""Protobuf records of one kind under a key prefix of the state store
(``PREFIX + name``), each read back with the store's revision as its
``version``: what the runtime and graph stores share. A store that cannot
be reached is UNAVAILABLE saying what was not done."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from controlplane.runtime.errors import NotFound, Unavailable
from controlplane.runtime.validation import short
from statestore import StateStore, StoreUnavailable


class Record(Protocol):
    """A stored message: it serializes and carries its version."""

    version: int

    def SerializeToString(self) -> bytes: ...


R = TypeVar("R", bound=Record)


def unchanged(current: R | None, stored: R) -> bool:
    """True when ``current`` (as read) holds what ``stored`` (version 0)
    would write; ``stored`` then takes current's version, so a put of an
    unchanged record writes nothing."""
    if current is None:
        return False
    version = current.version
    current.version = 0
    same = current == stored
    current.version = version
    if same:
        stored.version = version
    return same


class KeyedRecords(Generic[R]):
    """Records named ``kind`` (for messages) under ``prefix``."""

    def __init__(
        self, store: StateStore, prefix: str, kind: str, decode: Callable[[bytes], R]
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.kind = kind
        self.decode = decode

    def _record(self, value: bytes, version: int) -> R:
        record = self.decode(value)
        record.version = version
        return record

    async def find(self, name: str) -> R | None:
        """The record, or None when none has that name."""
        try:
            kv = await self.store.get(self.prefix + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return None if kv is None else self._record(kv.value, kv.version)

    async def every(self) -> list[R]:
        """Every record, in the store's order."""
        try:
            kvs = await self.store.get_prefix(self.prefix)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return [self._record(kv.value, kv.version) for kv in kvs]

    async def write(self, name: str, record: R) -> int:
        """Store record (its version is not stored); the new version."""
        try:
            return await self.store.put(self.prefix + name, record.SerializeToString())
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, {self.kind} not stored: {e}") from e

    async def remove(self, name: str) -> None:
        """Delete the record, or NotFound."""
        try:
            deleted = await self.store.delete(self.prefix + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, {self.kind} not deleted: {e}") from e
        if not deleted:
            raise NotFound(f"{self.kind} {short(name)} not found")
