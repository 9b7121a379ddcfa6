"""A node agent that restarts may listen at another address than the one
recorded with the instances its predecessor ran. Dispatch deletes such an
instance at the node's current agent (the newest address seen for the
node: an instance just started there, a credit granted on it), not at the
old address where nothing answers.

The node agent is a real gRPC server on a real socket; the old address is
a port nothing listens on (the agent that was killed).
"""

from __future__ import annotations

import socket

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from functions.dispatch import coordination
from functions.dispatch.dispatcher import Dispatcher
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc


class Agent(nodeagent_pb2_grpc.NodeAgentServicer):
    """Records the instances it was asked to delete."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()

    async def DeleteInstance(
        self, request: nodeagent_pb2.DeleteInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.DeleteInstanceReply:
        self.deleted.add(request.instance_id)
        return nodeagent_pb2.DeleteInstanceReply(deleted=True)


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _started(iid: str, agent_address: str) -> common_pb2.InstanceInfo:
    return common_pb2.InstanceInfo(
        instance_id=iid, function="f", node_id="n0", address="127.0.0.1:1",
        node_address=agent_address, concurrency=1,
    )  # fmt: skip


@pytest.mark.slow
async def test_an_instance_of_a_restarted_agent_is_deleted_at_its_new_address() -> None:
    agent = Agent()
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, "x")]
    )
    await server.start()
    pool = rpc.ChannelPool(RpcConfig(deadline_s=1.0))
    d = Dispatcher(instance_id="d0", pool=pool, controller="")
    try:
        router = d.router(common_pb2.FunctionSpec(name="f", concurrency=1, max_scale=2))
        router.begin_scale_up(2)
        # Started under the agent that was then killed, and one started on
        # the same node under its successor, at another port.
        assert d.add(router, _started("f-old", _dead_address()), cold=True)
        assert d.add(router, _started("f-new", f"127.0.0.1:{port}"), cold=True)
        coordination.function_deleted(d, "f")
        await d.settle()
        assert agent.deleted == {"f-old", "f-new"}
        assert d.peers.deletes_failed == 0
    finally:
        await d.close()
        await d.peers.close()
        await pool.close()
        await server.stop(None)
