"""The nodes ClusterMgr knows, as the controller asks for them: for
`galaxy status` (every node, with ClusterMgr's own failures as warnings) and
at deploy (the nodes' capacities, which a spec must fit and the default
quota is a share of; a ClusterMgr that does not answer is left out).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from controlplane.runtime import rpc
from galaxy.v1 import clustermgr_pb2, clustermgr_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

#: Deadline of the ListNodes call a deploy makes: a ClusterMgr slower than
#: this costs the deploy its node figures (judged as if none registered),
#: never the deploy itself.
DEPLOY_LIST_S = 2.0


async def cluster_nodes(
    pool: rpc.ChannelPool, clustermgr: common_pb2.ControlInstance, timeout_s: float
) -> list[clustermgr_pb2.ClusterNode]:
    """The nodes one ClusterMgr instance knows (grpc errors raised)."""
    async with pool.stub(clustermgr.address, clustermgr_pb2_grpc.ClusterMgrStub) as s:
        r = await s.ListNodes(clustermgr_pb2.ListClusterNodesRequest(), timeout=timeout_s)
    return list(r.nodes)


async def capacities(
    pool: rpc.ChannelPool,
    clustermgrs: Iterable[common_pb2.ControlInstance],
    timeout_s: float = DEPLOY_LIST_S,
) -> list[common_pb2.Resources]:
    """The capacity of every node the answering ClusterMgr instances know
    (alive or not: a node that is down for now is still the cluster's
    shape), one entry per node id."""
    members = list(clustermgrs)
    results = await asyncio.gather(
        *(cluster_nodes(pool, m, timeout_s) for m in members), return_exceptions=True
    )
    out: dict[str, common_pb2.Resources] = {}
    for m, res in zip(members, results, strict=True):
        if isinstance(res, BaseException):
            log.info("deploy: node capacities of clustermgr %s unknown: %r", m.id, res)
            continue
        for n in res:
            out[n.status.node_id] = n.status.capacity
    return list(out.values())
