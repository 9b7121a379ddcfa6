"""A start whose node is declared dead while its create waits is placed on
another node at once (not at the create's deadline), and stopped where
it was. Real Schedule, ClusterMgr and node agent servicers over gRPC."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from controlplane.nodeagent.sandbox import EmulatedBackend
from galaxy.v1 import schedule_pb2
from tests.cluster import eventually
from tests.schedule.test_service import make_stack, req, spec

__all__ = ["make_stack"]  # the fixture, shared with test_service

RETRIED = "galaxy_schedule_starts_retried_total"


async def test_a_start_on_a_node_declared_dead_is_placed_on_another(make_stack) -> None:
    st = await make_stack()
    backend = st.agent.backend
    assert isinstance(backend, EmulatedBackend)
    backend.start_delay_s = 60.0  # the first create waits far past the call's deadline
    before = REGISTRY.get_sample_value(RETRIED, {"reason": "node_dead"}) or 0.0
    call = asyncio.ensure_future(st.sf.Schedule(req("lost-1", spec()), timeout=10))
    try:
        await eventually(
            lambda: any("lost-1" in n.instances for n in st.agent.nodes.values()),
            what="the create to reach the agent",
        )
        first = next(nid for nid, n in st.agent.nodes.items() if "lost-1" in n.instances)
        backend.start_delay_s = 0.0  # the next node starts it at once
        # ClusterMgr declares the first node dead (its OP_REMOVE to Schedule).
        dead = schedule_pb2.ModNodeRequest(
            op=schedule_pb2.ModNodeRequest.OP_REMOVE,
            node=st.agent.heartbeat_status(first),
        )
        await st.sf.ModNode(dead, timeout=5)
        reply = await call
    finally:
        call.cancel()
    assert reply.instance.node_id != first, reply
    assert REGISTRY.get_sample_value(RETRIED, {"reason": "node_dead"}) == before + 1
    # The start given up is stopped on its node (the agent still serves it here).
    await eventually(
        lambda: "lost-1" not in st.agent.nodes[first].instances, what="the undo on the lost node"
    )
    assert "lost-1" in st.agent.nodes[reply.instance.node_id].instances
