"""Inference graphs in the state store (``/galaxy/graphs/NAME``).

A graph is kept as its checked document (JSON) with its name and namespace
beside it, so the gateway parses exactly what the controller checked. Names
are unique in the cluster, as function names are (the gateway serves
``/graphs/NAME`` without a namespace). Bounded: a graph document is
configuration, not data (``MAX_DOCUMENT_BYTES``), and each namespace holds at
most ``MAX_GRAPHS_PER_NAMESPACE`` graphs, so one tenant cannot fill the
store. Every read goes to the store, as for runtimes: graphs change rarely
and the gateway caches what it reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from controlplane.controller.keyed_store import KeyedRecords, unchanged
from controlplane.runtime import access, graphspec
from controlplane.runtime.errors import InvalidArgument, NotFound, ResourceExhausted
from controlplane.runtime.validation import short
from galaxy.v1 import controller_pb2
from statestore import StateStore

PREFIX = "/galaxy/graphs/"
#: A graph document's JSON at most (32 nodes of 16 steps fit in a few KiB).
MAX_DOCUMENT_BYTES = 64 * 1024
#: Graphs one namespace may hold.
MAX_GRAPHS_PER_NAMESPACE = 100

GraphSpec = controller_pb2.GraphSpec


def check_document(document_json: str, default_namespace: str) -> GraphSpec:
    """The graph a JSON document describes, checked (graphspec.parse), its
    namespace the document's or ``default_namespace``; InvalidArgument
    naming the field otherwise. Pure."""
    size = len(document_json.encode())
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"document_json: at most {MAX_DOCUMENT_BYTES} bytes, got {size}")
    if not document_json:
        raise InvalidArgument("document_json: required (the graph document as JSON)")
    try:
        doc = orjson.loads(document_json)
    except orjson.JSONDecodeError as e:
        raise InvalidArgument(f"document_json: not JSON ({str(e)[:80]})") from None
    graph = graphspec.parse(doc)
    namespace = graph.namespace or default_namespace or access.DEFAULT_NAMESPACE
    doc["namespace"] = namespace
    return GraphSpec(name=graph.name, namespace=namespace, document_json=orjson.dumps(doc).decode())


class GraphStore:
    """Graphs keyed by name, versioned by the store's revision."""

    def __init__(
        self, store: StateStore, max_per_namespace: int = MAX_GRAPHS_PER_NAMESPACE
    ) -> None:
        self.records = KeyedRecords(store, PREFIX, "graph", GraphSpec.FromString)
        self.max_per_namespace = max_per_namespace
        # A put's count and write, and a delete, happen one at a time: two
        # applies cannot both take a namespace's last place.
        self.lock = asyncio.Lock()

    async def put(
        self, graph: GraphSpec, admit: Callable[[GraphSpec | None], None] = lambda _: None
    ) -> GraphSpec:
        """Store a checked graph (``check_document``); returns it with its
        version. ``admit`` sees the graph stored under that name (None: none)
        and raises to refuse the put (namespace rules)."""
        stored = GraphSpec()
        stored.CopyFrom(graph)
        stored.version = 0
        async with self.lock:
            current = await self.find(stored.name)
            admit(current)
            if unchanged(current, stored):
                return stored  # nothing to write
            if current is None:
                n = sum(g.namespace == stored.namespace for g in await self.list())
                if n >= self.max_per_namespace:
                    raise ResourceExhausted(
                        f"graphs: namespace {stored.namespace} holds {n} graphs, at most "
                        f"{self.max_per_namespace} allowed; delete one first"
                    )
            stored.version = await self.records.write(stored.name, stored)
        return stored

    async def get(self, name: str) -> GraphSpec:
        """The graph, or NotFound."""
        graph = await self.find(name)
        if graph is None:
            raise NotFound(
                f"graph {short(name)} not found; see `galaxy graphs list`, or store one "
                "with `galaxy graphs apply -f FILE`"
            )
        return graph

    async def find(self, name: str) -> GraphSpec | None:
        """The graph, or None when no graph has that name."""
        return await self.records.find(name)

    async def delete(self, name: str) -> None:
        """Delete the graph, or NotFound."""
        await self.records.remove(name)

    # Last: the name shadows the builtin in annotations below it.
    async def list(self) -> list[GraphSpec]:
        """Every graph, sorted by name."""
        return sorted(await self.records.every(), key=lambda g: g.name)
