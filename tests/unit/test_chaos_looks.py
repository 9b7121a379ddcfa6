"""`galaxy chaos` counts instances by asking each node agent: a refused
connection (UNAVAILABLE) gets another look, other errors end the run; and
a ghost (routed by Dispatch, run by no agent) is found by instance id."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from controlplane.tools import chaos_checks
from galaxy.v1 import common_pb2, controller_pb2, nodeagent_pb2, nodeagent_pb2_grpc


class Agent(nodeagent_pb2_grpc.NodeAgentServicer):
    def __init__(self, fail: list[grpc.StatusCode], runs: dict[str, list[str]] | None = None):
        self.fail = fail
        self.runs = runs or {}  # node -> instance ids it runs
        self.calls = 0

    async def ListNodeInstances(self, request, context):
        self.calls += 1
        if self.fail:
            await context.abort(self.fail.pop(0), "not now")
        ids = self.runs.get(request.node_id, [])
        infos = [common_pb2.InstanceInfo(instance_id=i, node_id=request.node_id) for i in ids]
        return nodeagent_pb2.ListNodeInstancesReply(instances=infos)


async def _look(fail: list[grpc.StatusCode]) -> tuple[Agent, object]:
    agent = Agent(fail)
    server = grpc.aio.server()
    nodeagent_pb2_grpc.add_NodeAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = rpc.ChannelPool(RpcConfig(deadline_s=5.0))
    try:
        out: object = await chaos_checks.list_node(pool, f"127.0.0.1:{port}", "node-0")
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
        ([grpc.StatusCode.UNAVAILABLE] * chaos_checks.LOOKS, grpc.StatusCode.UNAVAILABLE, 3),
        ([grpc.StatusCode.PERMISSION_DENIED], grpc.StatusCode.PERMISSION_DENIED, 1),
    ],
)
def test_lasting_or_other_errors_end_the_look(fail, code, calls):
    agent, out = asyncio.run(_look(fail))
    assert out == code
    assert agent.calls == calls


class _Child:
    """What ghost_ids reads of a supervised child."""

    def __init__(self, name: str, ready: dict[str, object], returncode: int | None = None):
        self.name, self.ready = name, ready
        self.proc = type("P", (), {"returncode": returncode})()


class _Client:
    """Dispatch's view (GetClusterStatus) of (node, instance id) pairs."""

    def __init__(self, routed: list[tuple[str, str]]) -> None:
        self.routed = routed

    async def status(self) -> controller_pb2.ClusterStatus:
        out = controller_pb2.ClusterStatus()
        for node, iid in self.routed:
            out.instances.add().instance.CopyFrom(
                common_pb2.InstanceInfo(instance_id=iid, node_id=node)
            )
        return out


async def _ghosts(routed: list[tuple[str, str]], dead_agent: bool) -> list[str]:
    # agent-0 runs n-0's "a" only; agent-1 (n-1) is killed or its address unknown.
    agent = Agent([], {"n-0": ["a"], "n-1": ["c"]})
    server = grpc.aio.server()
    nodeagent_pb2_grpc.add_NodeAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sup = type("Sup", (), {})()
    sup.children = [
        _Child("agent-0", {"address": f"127.0.0.1:{port}", "nodes": ["n-0"]}),
        _Child("agent-1", {"address": f"127.0.0.1:{port}", "nodes": ["n-1"]},
               returncode=-9 if dead_agent else None),
        _Child("dispatch-0", {"address": f"127.0.0.1:{port}", "nodes": ["n-1"]}),
    ]  # fmt: skip
    pool = rpc.ChannelPool(RpcConfig(deadline_s=5.0))
    try:
        return await chaos_checks.ghost_ids(_Client(routed), sup, pool)  # type: ignore[arg-type]
    finally:
        await pool.close()
        await server.stop(None)


def test_a_ghost_is_a_routed_id_no_running_agent_runs():
    routed = [("n-0", "a"), ("n-0", "b"), ("n-1", "c")]
    # "b" is routed on n-0, whose agent runs only "a"; equal counts would
    # have hidden it had the agent been starting another instance.
    assert asyncio.run(_ghosts(routed, dead_agent=False)) == ["b"]
    # A dead agent runs nothing: what Dispatch routes on its node is a ghost,
    # though another child (not an agent) names the node.
    assert asyncio.run(_ghosts(routed, dead_agent=True)) == ["b", "c"]
    assert asyncio.run(_ghosts([("n-0", "a")], dead_agent=True)) == []
