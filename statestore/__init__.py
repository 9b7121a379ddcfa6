"""Galaxy's state store: one async key-value interface, an in-memory and an etcd backend.

``open_store(url)`` picks the backend from a URL:

* ``memory://`` -> ``MemoryStore`` (in-process; the embedded default)
* ``etcd://host:port[,host:port...]`` -> ``EtcdStore``

``WriteBehind`` batches non-critical writes off the request path.
"""

from __future__ import annotations

from .base import (
    KV,
    EventType,
    LeaseNotFound,
    StateStore,
    StoreError,
    StoreUnavailable,
    Watch,
    WatchEvent,
)
from .etcd import EtcdStore
from .memory import MemoryStore
from .writebehind import WriteBehind

__all__ = [
    "KV",
    "EtcdStore",
    "EventType",
    "LeaseNotFound",
    "MemoryStore",
    "StateStore",
    "StoreError",
    "StoreUnavailable",
    "Watch",
    "WatchEvent",
    "WriteBehind",
    "open_store",
]

_ACCEPTED = "'memory://' or 'etcd://host:port[,host:port...]'"


def open_store(url: str) -> StateStore:
    """Create the store named by ``url`` (no I/O happens until first use).

    Raises ``ValueError`` for any other form, naming the accepted ones.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"state store URL {url!r} has no scheme; use {_ACCEPTED}")
    scheme = scheme.lower()
    if scheme == "memory":
        if rest.strip("/"):
            raise ValueError(f"memory store URL takes no address: {url!r}; use 'memory://'")
        return MemoryStore()
    if scheme == "etcd":
        endpoints = [e.strip() for e in rest.rstrip("/").split(",") if e.strip()]
        if not endpoints:
            raise ValueError(f"etcd URL {url!r} names no endpoint; use {_ACCEPTED}")
        return EtcdStore(endpoints)
    raise ValueError(f"unknown state store scheme {scheme!r} in {url!r}; use {_ACCEPTED}")
