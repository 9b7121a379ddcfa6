"""`galaxy chaos` counts instances by asking each node agent: a refused
connection (UNAVAILABLE) gets another look, other errors end the run."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from controlplane.tools import chaos_more
from galaxy.v1 import nodeagent_pb2, nodeagent_pb2_grpc


class Agent(nodeagent_pb2_grpc.NodeAgentServicer):
    def __init__(self, fail: list[grpc.StatusCode]) -> None:
        self.fail = fail
        self.calls = 0

    async def ListNodeInstances(self, request, context):
        self.calls += 1
        if self.fail:
            await context.abort(self.fail.pop(0), "not now")
        return nodeagent_pb2.ListNodeInstancesReply()


async def _look(fail: list[grpc.StatusCode]) -> tuple[Agent, object]:
    agent = Agent(fail)
    server = grpc.aio.server()
    nodeagent_pb2_grpc.add_NodeAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = rpc.ChannelPool(RpcConfig(deadline_s=5.0))
    try:
        out: object = await chaos_more._list_node(pool, f"127.0.0.1:{port}", "node-0")
    except grpc.aio.AioRpcError as e:
        out = e.code()
    finally:
        await pool.close()
        await server.stop(None)
    return agent, out


def test_unavailable_gets_another_look():
    agent, out = asyncio.run(_look([grpc.StatusCode.UNAVAILABLE] * 2))
    assert isinstance(out, nodeagent_pb2.ListNodeInstancesReply)
    assert agent.calls == 3


@pytest.mark.parametrize(
    "fail,code,calls",
    [
        ([grpc.StatusCode.UNAVAILABLE] * chaos_more.LOOKS, grpc.StatusCode.UNAVAILABLE, 3),
        ([grpc.StatusCode.PERMISSION_DENIED], grpc.StatusCode.PERMISSION_DENIED, 1),
    ],
)
def test_lasting_or_other_errors_end_the_look(fail, code, calls):
    agent, out = asyncio.run(_look(fail))
    assert out == code
    assert agent.calls == calls
