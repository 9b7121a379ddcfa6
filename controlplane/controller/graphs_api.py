"""The controller's inference-graph RPCs (ApplyGraph, GetGraph, ListGraphs,
DeleteGraph), mixed into ControllerServicer. Namespaced like functions: who
may call them is decided before they run (``access.decide``), and the
namespace of the graph is checked here against the caller
(``authn.current``): a developer acts on its own namespace's graphs, an
admin on all of them, an invoker may read (so run) its namespace's graphs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from controlplane.controller.graphs_store import GraphSpec, check_document
from controlplane.controller.leaderonly import leader_only
from controlplane.runtime import authn, validation
from controlplane.runtime.errors import FailedPrecondition
from galaxy.v1 import controller_pb2

if TYPE_CHECKING:
    from controlplane.controller.graphs_store import GraphStore

log = logging.getLogger(__name__)


class GraphsApi:
    """Graph administration; needs ``graphs``."""

    graphs: GraphStore

    @leader_only
    async def ApplyGraph(
        self, request: controller_pb2.ApplyGraphRequest, context: grpc.aio.ServicerContext
    ) -> GraphSpec:
        graph = check_document(request.document_json, authn.current().namespace)
        what = f"graph {graph.name}"
        authn.ensure_namespace(graph.namespace, what)

        def admit(current: GraphSpec | None) -> None:
            if current is None:
                return
            authn.ensure_namespace(current.namespace, what)
            if current.namespace != graph.namespace:
                raise FailedPrecondition(
                    f"namespace: {what} is in namespace {current.namespace}; a graph's "
                    "namespace cannot change (delete it, then apply it again)"
                )

        stored = await self.graphs.put(graph, admit)
        log.info("graph %s stored in %s (version %d)", stored.name, stored.namespace,
                 stored.version)  # fmt: skip
        return stored

    async def _visible_graph(self, name: str) -> GraphSpec:
        validation.check_name("name", name)
        graph = await self.graphs.get(name)
        authn.ensure_namespace(graph.namespace, f"graph {name}")
        return graph

    @leader_only
    async def GetGraph(
        self, request: controller_pb2.GetGraphRequest, context: grpc.aio.ServicerContext
    ) -> GraphSpec:
        return await self._visible_graph(request.name)

    @leader_only
    async def ListGraphs(
        self, request: controller_pb2.ListGraphsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListGraphsReply:
        who = authn.current()
        return controller_pb2.ListGraphsReply(
            graphs=[g for g in await self.graphs.list() if who.sees(g.namespace)]
        )

    @leader_only
    async def DeleteGraph(
        self, request: controller_pb2.DeleteGraphRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteGraphReply:
        async with self.graphs.lock:
            await self._visible_graph(request.name)
            await self.graphs.delete(request.name)
        log.info("deleted graph %s", request.name)
        return controller_pb2.DeleteGraphReply()
