"""Fault injection for the node agent tests: misbehaving peers that the real
components cannot be made to be."""

from __future__ import annotations

import asyncio
from collections import Counter

from controlplane.runtime import rpc
from functions.clustermgr.service import SERVICE_NAME
from galaxy.v1 import clustermgr_pb2_grpc


class HangingClusterMgr(clustermgr_pb2_grpc.ClusterMgrServicer):
    """Fault injection: a peer that never answers; the real ClusterMgr cannot
    be made to hang.

    Every call waits until the server stops. ``hanging`` counts, per node id,
    the RegisterNode/Update calls waiting now.
    """

    def __init__(self) -> None:
        self.hanging: Counter[str] = Counter()

    async def _hang(self, node_id: str = "") -> None:
        self.hanging[node_id] += 1
        try:
            await asyncio.Event().wait()  # until the server stops
        finally:
            self.hanging[node_id] -= 1

    async def RegisterNode(self, request, context):
        await self._hang(request.node_id)

    async def Update(self, request, context):
        await self._hang(request.node_id)

    async def Coordinate(self, request, context):
        await self._hang()

    async def ListNodes(self, request, context):
        await self._hang()

    def nodes(self) -> set[str]:
        """Nodes with a call hanging now."""
        return {n for n, c in self.hanging.items() if n and c > 0}


async def serve_hanging_clustermgr():
    """Start a HangingClusterMgr on a loopback port; returns (it, server, address)."""
    hung = HangingClusterMgr()
    add = clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server
    server, port, _ = rpc.create_server("127.0.0.1:0", [(add, hung, SERVICE_NAME)])
    await server.start()
    return hung, server, f"127.0.0.1:{port}"
