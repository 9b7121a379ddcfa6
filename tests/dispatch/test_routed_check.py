"""Dispatch's orphan check the other way round: an instance it routes that
its node agent does not run (the agent restarted, or lost it, and the node
was never declared dead) is unrouted within one check and counted, so no
request is granted a slot on it. An agent that cannot be asked proves
nothing (node death is ClusterMgr's call), and an instance routed just now
is not judged.

The node agent is a real gRPC server on a real socket that answers
ListNodeInstances with what it runs.
"""

from __future__ import annotations

import socket

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.config import RpcConfig
from functions.dispatch import routedcheck
from functions.dispatch.dispatcher import Dispatcher
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc


class Agent(nodeagent_pb2_grpc.NodeAgentServicer):
    """Runs the instances in ``runs`` (on every node it is asked about)."""

    def __init__(self, runs: set[str]) -> None:
        self.runs = runs

    async def ListNodeInstances(
        self, request: nodeagent_pb2.ListNodeInstancesRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.ListNodeInstancesReply:
        return nodeagent_pb2.ListNodeInstancesReply(
            instances=[common_pb2.InstanceInfo(instance_id=i) for i in sorted(self.runs)]
        )


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _info(iid: str, node: str, agent: str) -> common_pb2.InstanceInfo:
    return common_pb2.InstanceInfo(
        instance_id=iid, function="f", node_id=node, address="127.0.0.1:1",
        node_address=agent, concurrency=1,
    )  # fmt: skip


async def test_a_routed_instance_its_agent_does_not_run_is_unrouted_and_counted() -> None:
    agent = Agent({"f-live"})
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, "x")]
    )
    await server.start()
    pool = rpc.ChannelPool(RpcConfig(deadline_s=1.0))
    clock = ManualClock()
    records: dict[str, bytes | None] = {}
    d = Dispatcher(
        instance_id="d0", pool=pool, controller="", clock=clock,
        record=lambda k, v: records.__setitem__(k, v),
    )  # fmt: skip
    try:
        router = d.router(common_pb2.FunctionSpec(name="f", concurrency=1, max_scale=4))
        here = f"127.0.0.1:{port}"
        for info in (
            _info("f-live", "n0", here),
            _info("f-ghost", "n0", here),  # its agent restarted: it runs no more
            _info("f-unknown", "n1", _dead_address()),  # an agent not answering
        ):
            router.begin_scale_up(1)
            assert d.add(router, info, cold=True)
        clock.advance(routedcheck.GRACE_S)
        router.begin_scale_up(1)
        d.add(router, _info("f-just-started", "n2", here), cold=True)
        before = routedcheck.ROUTED_NOT_RUNNING._value.get()
        assert await d.check_routed() == 1
        assert set(router.instances) == {"f-live", "f-unknown", "f-just-started"}
        assert routedcheck.ROUTED_NOT_RUNNING._value.get() == before + 1
        assert records["/galaxy/instances/f/f-ghost"] is None
        granted = [router.acquire() for _ in range(4)]  # every free slot, and one more
        assert {g.instance.instance_id for g in granted if g} == set(router.instances)
        assert granted[-1] is None  # no slot on the ghost
    finally:
        await d.close()
        await d.peers.close()
        await pool.close()
        await server.stop(None)
