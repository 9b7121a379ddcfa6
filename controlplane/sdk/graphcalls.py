"""The SDK's inference-graph calls (docs/models.md, graphs), mixed into
``GalaxyClient``."""

from __future__ import annotations

from typing import Any

from galaxy.v1 import controller_pb2

#: Calls that only read: retried while controllers fail over.
GRAPH_READS = frozenset({"GetGraph", "ListGraphs"})


class GraphCalls:
    """ApplyGraph, GetGraph, ListGraphs and DeleteGraph; the client
    provides ``_ctl``."""

    async def _ctl(
        self, method: str, request: Any, retry_s: float | None = None, token: str | None = None
    ) -> Any:
        raise NotImplementedError

    async def apply_graph(self, document_json: str) -> controller_pb2.GraphSpec:
        """Store or replace an inference graph (its document as JSON);
        durable when this returns."""
        req = controller_pb2.ApplyGraphRequest(document_json=document_json)
        return await self._ctl("ApplyGraph", req)  # type: ignore[no-any-return]

    async def get_graph(
        self, name: str, token: str | None = None, retry_s: float | None = None
    ) -> controller_pb2.GraphSpec:
        """A stored graph (NOT_FOUND if none; PERMISSION_DENIED outside the
        caller's namespace). token: asked on behalf of that caller."""
        req = controller_pb2.GetGraphRequest(name=name)
        return await self._ctl("GetGraph", req, retry_s=retry_s, token=token)  # type: ignore[no-any-return]

    async def list_graphs(self) -> list[controller_pb2.GraphSpec]:
        """The stored graphs the caller may see, by name."""
        r = await self._ctl("ListGraphs", controller_pb2.ListGraphsRequest())
        return list(r.graphs)

    async def delete_graph(self, name: str) -> None:
        """Delete a stored graph."""
        await self._ctl("DeleteGraph", controller_pb2.DeleteGraphRequest(name=name))
