"""Where the gateway finds a graph: the controller's stored graphs first,
then the ``--graphs-dir`` files.

A stored graph is read with the caller's token, so the controller judges
whether the caller may read (so run) the graph's namespace; the answer
(the graph, or NOT_FOUND / PERMISSION_DENIED / UNAUTHENTICATED) is kept
``TTL_S`` per (graph, caller), so a graph applied, replaced or deleted is
served as such within ``TTL_S``, and a flood of calls to one graph costs the
controller one read per caller per ``TTL_S``: callers that miss together
share one read (single flight). A name the controller does not
hold is looked up in the files: a stored graph wins a name clash (the
control plane is the source of truth; the files are the fallback of a
gateway run without one). A file graph has no namespace check of its own:
each of its steps is still dispatched with the caller's token, so it runs
only functions the caller may invoke.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import orjson

from controlplane.runtime import graphspec
from controlplane.runtime.errors import (
    GalaxyError,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from controlplane.sdk.client import GalaxyClient

#: How long a graph (or a refusal) read from the controller is used.
TTL_S = 2.0
#: A lookup's bound: a slow controller fails the call, it does not hold it.
LOOKUP_TIMEOUT_S = 2.0
#: (graph, caller) answers kept at most, oldest dropped first.
MAX_ENTRIES = 1024
#: Answers worth keeping: what the controller decided, not that it failed.
_KEPT = (NotFound, PermissionDenied, Unauthenticated)

Found = graphspec.Graph | GalaxyError


class GraphSource:
    """The graphs one gateway serves (see the module docstring). client:
    None when the gateway reads files only; clock: seconds (injected)."""

    def __init__(
        self,
        client: GalaxyClient | None,
        files: dict[str, graphspec.Graph],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.files = files
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Found]] = {}
        # Reads under way, one per key (bounded by the gateway's in-flight
        # bound: each is awaited by at least one request).
        self._reading: dict[tuple[str, str], asyncio.Task[Found]] = {}

    def _now(self) -> float:
        return self.clock() if self.clock else asyncio.get_running_loop().time()

    async def find(self, name: str, token: str | None) -> graphspec.Graph:
        """Graph ``name`` as the caller (``token``; None: the gateway's own
        rights, tokens off) may run it; NotFound, PermissionDenied,
        Unauthenticated or Unavailable otherwise."""
        if self.client is None:
            return self._file(name)
        # The secret is not kept as a key: its digest tells callers apart.
        key = (name, hashlib.sha256((token or "").encode()).hexdigest())
        now = self._now()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            found = hit[1]
        else:
            found = await self._read_shared(key, name, token)
        if isinstance(found, NotFound):
            return self._file(name)
        if isinstance(found, GalaxyError):
            raise found
        return found

    async def _read_shared(self, key: tuple[str, str], name: str, token: str | None) -> Found:
        """One controller read per key at a time, its answer cached; a caller
        that gives up (cancelled) does not cancel the read the others wait on."""
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read_and_keep(key, name, token))
            self._reading[key] = task
            task.add_done_callback(lambda _: self._reading.pop(key, None))
        return await asyncio.shield(task)

    async def _read_and_keep(self, key: tuple[str, str], name: str, token: str | None) -> Found:
        found = await self._read(name, token)
        if isinstance(found, (graphspec.Graph, *_KEPT)):
            self._cache.pop(key, None)
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.pop(next(iter(self._cache)))
            # From when the answer came: the bound is on its age.
            self._cache[key] = (self._now() + TTL_S, found)
        return found

    async def _read(self, name: str, token: str | None) -> Found:
        """The controller's answer for graph ``name``."""
        assert self.client is not None
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                stored = await self.client.get_graph(name, token, retry_s=LOOKUP_TIMEOUT_S)
        except TimeoutError:
            return Unavailable(f"graph {name}: the controller did not answer within "
                               f"{LOOKUP_TIMEOUT_S:g}s")  # fmt: skip
        except GalaxyError as e:
            return e
        return graphspec.parse(orjson.loads(stored.document_json))

    def _file(self, name: str) -> graphspec.Graph:
        graph = self.files.get(name)
        if graph is None:
            raise NotFound(f"path: no graph {name!r}")
        return graph
