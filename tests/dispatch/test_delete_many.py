"""Deleting a function with many instances stops every one of them on its
node agent: the deletes go out a bounded number at a time (each deadline
runs from when its call is sent) and failed calls are tried again; one that
cannot be deleted is counted and logged, never silently dropped.

The node agent is a real gRPC server on a real socket that serves
DeleteInstance one at a time, a few milliseconds each: a slow agent, as a
loaded machine makes it. Sent all at once with a short deadline, most of
the calls expired before it reached them (docs/reliability.md, delete-many).
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig
from functions.dispatch import coordination, peers
from functions.dispatch.policy import Instance
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc

INSTANCES = 400
SERVICE_S = 0.004  # per delete, one at a time: 1.6 s for all
DEADLINE_S = 1.0


class SlowAgent(nodeagent_pb2_grpc.NodeAgentServicer):
    """DeleteInstance one at a time; records what it deleted."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self._one = asyncio.Lock()

    async def DeleteInstance(
        self, request: nodeagent_pb2.DeleteInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.DeleteInstanceReply:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            async with self._one:
                await asyncio.sleep(SERVICE_S)  # the agent's work (a loaded machine)
                self.deleted.add(request.instance_id)
        finally:
            self.in_flight -= 1
        return nodeagent_pb2.DeleteInstanceReply(deleted=True)


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.slow
async def test_deleting_a_large_function_stops_every_instance() -> None:
    agent = SlowAgent()
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, "x")]
    )
    await server.start()
    pool = rpc.ChannelPool(RpcConfig(deadline_s=DEADLINE_S))
    svc = DispatchServicer(instance_id="d0", pool=pool, controller="")
    try:
        router = svc.dispatcher.router(
            common_pb2.FunctionSpec(name="f", concurrency=1, max_scale=INSTANCES)
        )
        ids = [f"f-{i}" for i in range(INSTANCES)]
        for iid in ids:
            info = common_pb2.InstanceInfo(
                instance_id=iid, function="f", node_id="n0", node_address=f"127.0.0.1:{port}"
            )
            router.add_instance(Instance(iid, "127.0.0.1:1", "n0", 1, meta=info))
        failed_before = svc.dispatcher.peers.deletes_failed
        coordination.function_deleted(svc.dispatcher, "f")
        await svc.dispatcher.settle()
        assert "f" not in svc.dispatcher.routers
        assert agent.deleted == set(ids)
        assert svc.dispatcher.peers.deletes_failed == failed_before
        assert agent.most_in_flight <= peers.DELETE_CONCURRENCY
    finally:
        await svc.dispatcher.close()
        await pool.close()
        await server.stop(None)


@pytest.mark.slow
async def test_an_instance_that_cannot_be_deleted_is_counted_not_dropped() -> None:
    pool = rpc.ChannelPool(RpcConfig(deadline_s=DEADLINE_S))
    svc = DispatchServicer(instance_id="d0", pool=pool, controller="")
    try:
        info = common_pb2.InstanceInfo(
            instance_id="f-0", function="f", node_id="n0", node_address=_dead_address()
        )
        before = peers.DELETES_FAILED.labels("UNAVAILABLE")._value.get()
        assert not await svc.dispatcher.peers.delete_on_node(info)
        assert svc.dispatcher.peers.deletes_failed == 1
        assert peers.DELETES_FAILED.labels("UNAVAILABLE")._value.get() == before + 1
    finally:
        await svc.dispatcher.close()
        await pool.close()
