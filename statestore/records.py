"""Write-behind records: instance and node state goes to the state store off
the critical path (DESIGN.md, "State — asynchronous").

Dispatch and ClusterMgr take a ``record(key, value_or_None)`` callable; this
module makes one from a store URL, backed by a WriteBehind queue.
"""

from __future__ import annotations

from controlplane.runtime.config import Config, setting
from statestore import StateStore, WriteBehind, open_store
from statestore.leased import DEFAULT_RECORD_TTL_S, LeasedStore


class RecordsConfig(Config):
    """Where a component writes its records, and how long they outlive it
    (the base of the configs of components that write records)."""

    state: str = setting(
        "memory://",
        "state store for records written behind: memory:// (per process, the embedded "
        "default), etcd://host:port[,host:port] or etcds:// (TLS)",
        max_length=1024,
    )
    record_ttl_s: float = setting(
        DEFAULT_RECORD_TTL_S,
        "lease of the records this process writes: they disappear this long after it dies",
        gt=0,
        le=3600,
    )


class Recorder:
    """A never-blocking ``record(key, value | None)`` over a write-behind queue.

    Records are attached to a lease this process keeps alive
    (``LeasedStore``): they disappear within ``ttl_s`` of the process dying,
    and at once when it stops cleanly."""

    def __init__(self, url: str, ttl_s: float = DEFAULT_RECORD_TTL_S) -> None:
        self.leased = LeasedStore(open_store(url), ttl_s)
        self.store: StateStore = self.leased
        self.writer = WriteBehind(self.store)

    def __call__(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.writer.delete(key)
        else:
            self.writer.put(key, value)

    def start(self) -> None:
        """Start flushing in the background."""
        self.writer.start()

    async def stop(self) -> None:
        """Flush what is queued (bounded by the queue's own retries) and close."""
        await self.writer.stop(flush=True)
        await self.store.close()
