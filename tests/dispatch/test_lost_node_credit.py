"""A start from a capacity credit whose node is declared dead while its
create waits goes through Schedule at once (not at the create's deadline):
counted, the node's credits dropped, the start stopped on the node. A real
node agent servicer over gRPC (its emulated sandbox takes a minute to start)."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import SERVICE_NAME as AGENT_SERVICE
from controlplane.nodeagent.service import NodeAgentServicer
from controlplane.runtime import rpc
from controlplane.runtime.resources import Res
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, nodeagent_pb2_grpc
from tests.cluster import eventually
from tests.dispatch.test_start_in_doubt import hold_one_credit

RETRIED = "galaxy_dispatch_starts_retried_total"


async def test_a_credit_start_on_a_node_declared_dead_goes_to_schedule() -> None:
    backend = EmulatedBackend()
    backend.start_delay_s = 60.0  # far past the requests' deadlines
    agent = NodeAgentServicer([("n0", Res(4000, 4096, 0))], backend)
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, AGENT_SERVICE)]
    )
    await server.start()
    pool = rpc.ChannelPool()
    agent.attach(f"127.0.0.1:{port}", pool)
    svc = DispatchServicer(instance_id="d0", pool=pool, controller="")
    p = svc.dispatcher.peers
    wallet = hold_one_credit(p, f"127.0.0.1:{port}")
    spec = common_pb2.FunctionSpec(
        name="f", resources=common_pb2.Resources(cpu_millis=100, memory_mib=64)
    )
    s0 = common_pb2.ControlInstance(id="s0", kind=common_pb2.CONTROL_KIND_SCHEDULE)
    before = REGISTRY.get_sample_value(RETRIED, {"reason": "node_dead"}) or 0.0
    start = asyncio.ensure_future(p.from_credit(spec, "f-d0-0", [s0]))
    try:
        await eventually(
            lambda: "f-d0-0" in agent.nodes["n0"].instances, what="the create to reach the agent"
        )
        dead = common_pb2.CoordinateAction(
            kind=common_pb2.CoordinateAction.KIND_NODE_DEAD, node_id="n0"
        )  # what ClusterMgr sends every Dispatch instance
        await svc.Coordinate(common_pb2.CoordinateRequest(actions=[dead]), None)  # type: ignore[arg-type]
        info = await asyncio.wait_for(start, 10.0)
        assert info is None  # not created: the start goes through Schedule
        assert REGISTRY.get_sample_value(RETRIED, {"reason": "node_dead"}) == before + 1
        assert not [c for c in wallet.credits() if c.node_id == "n0"]  # not used again
        await eventually(
            lambda: "f-d0-0" not in agent.nodes["n0"].instances, what="the undo on the node"
        )
    finally:
        start.cancel()
        await svc.dispatcher.close()
        await p.close()
        await agent.close()
        await pool.close()
        await server.stop(None)


async def test_a_node_declared_dead_takes_its_credits_along() -> None:
    # No create in flight there: the next start must not use the dead
    # node's credit (on a stopped agent its create would wait for a probe).
    svc = DispatchServicer(instance_id="d0", pool=rpc.ChannelPool(), controller="")
    wallet = hold_one_credit(svc.dispatcher.peers, "127.0.0.1:9")
    assert [c.node_id for c in wallet.credits()] == ["n0"]
    dead = common_pb2.CoordinateAction(
        kind=common_pb2.CoordinateAction.KIND_NODE_DEAD, node_id="n0"
    )
    other = common_pb2.CoordinateAction(
        kind=common_pb2.CoordinateAction.KIND_NODE_DEAD, node_id="n9"
    )
    await svc.Coordinate(common_pb2.CoordinateRequest(actions=[other]), None)  # type: ignore[arg-type]
    assert [c.node_id for c in wallet.credits()] == ["n0"]  # another node's death: kept
    await svc.Coordinate(common_pb2.CoordinateRequest(actions=[dead]), None)  # type: ignore[arg-type]
    assert wallet.credits() == []
    assert wallet.take(Res(100, 64), "f") is None
