"""Write-behind records: instance and node state goes to the state store off
the critical path (DESIGN.md, "State — asynchronous").

Dispatch and ClusterMgr take a ``record(key, value_or_None)`` callable; this
module makes one from a store URL, backed by a WriteBehind queue.
"""

from __future__ import annotations

import argparse

from statestore import StateStore, WriteBehind, open_store
from statestore.leased import DEFAULT_RECORD_TTL_S, LeasedStore


def add_state_argument(p: argparse.ArgumentParser) -> None:
    """The --state flag shared by components that write records behind."""
    p.add_argument(
        "--state",
        default="memory://",
        help="state store for records written behind: memory:// (per process, the "
        "embedded default) or etcd://host:port[,host:port]",
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
