"""WatchedCreates over gRPC: a slow start on an agent that answers its
probes is never given up, nor one on an agent that answers them late (a
starved agent); a create to an agent that answers nothing is given up
(``no_answer``) once a probe goes unanswered, and its call ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import SERVICE_NAME as AGENT_SERVICE
from controlplane.nodeagent.service import NodeAgentServicer
from controlplane.runtime import rpc
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.create_watch import NO_ANSWER
from controlplane.runtime.resources import Res
from controlplane.runtime.watched_creates import NodeLost, WatchedCreates
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc


class CountingCreates(WatchedCreates):
    """WatchedCreates that counts the probes it sends (a spy, not a fake)."""

    probes = 0

    async def _probe(self, node_id: str, address: str) -> None:
        self.probes += 1
        await super()._probe(node_id, address)


class SilentAgent(nodeagent_pb2_grpc.NodeAgentServicer):
    """Fake: a node agent that takes calls and answers none, which is what
    a SIGSTOPped agent looks like on a connection opened before the stop
    (the real one: tests/integration/test_stopped_node.py)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def CreateInstance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        context.add_done_callback(lambda _: self.gone.set())
        await asyncio.Event().wait()

    async def Probe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await asyncio.Event().wait()

    async def InstanceStream(self, request_iterator: Any, context: Any) -> Any:
        # No stream here, said outright as an older agent says it: the create
        # goes as the unary call this test watches. (With the base class's
        # NotImplementedError instead, one run under load failed with the
        # create's own AioRpcError before any probe; not reproduced in 15.)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no InstanceStream here")


class StarvedAgent(NodeAgentServicer):
    """The real agent, its probes answered late (an emulation of an agent
    starved of CPU by an engine's minutes of imports on its node)."""

    late_s = 0.3

    async def Probe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await asyncio.sleep(self.late_s)
        return await super().Probe(request, context)


def create_req(iid: str) -> nodeagent_pb2.CreateInstanceRequest:
    fn = common_pb2.FunctionSpec(
        name="f", resources=common_pb2.Resources(cpu_millis=100, memory_mib=64)
    )
    return nodeagent_pb2.CreateInstanceRequest(node_id="n0", instance_id=iid, function=fn)


async def serve(servicer: Any) -> tuple[grpc.aio.Server, str]:
    add = nodeagent_pb2_grpc.add_NodeAgentServicer_to_server
    server, port, _ = rpc.create_server("127.0.0.1:0", [(add, servicer, AGENT_SERVICE)])
    await server.start()
    return server, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def agent_with(
    agent_class: type[NodeAgentServicer], start_delay_s: float, **watch: float
) -> AsyncIterator[tuple[CountingCreates, str]]:
    """A real agent (of ``agent_class``) whose starts take ``start_delay_s``,
    served over gRPC, and a WatchedCreates (``watch``: its timings) to it."""
    backend = EmulatedBackend()
    backend.start_delay_s = start_delay_s
    agent = agent_class([("n0", Res(4000, 4096, 0))], backend)
    server, address = await serve(agent)
    pool = rpc.ChannelPool()
    agent.attach(address, pool)
    calls = AgentCalls(lambda: pool)
    wc = CountingCreates(calls, lambda: pool, **watch)
    try:
        yield wc, address
    finally:
        await wc.close()
        await calls.close()
        await agent.close()
        await pool.close()
        await server.stop(None)


async def test_a_slow_start_on_an_agent_that_answers_probes_is_not_given_up() -> None:
    # ten checks while it starts
    async with agent_with(NodeAgentServicer, 0.5, check_s=0.05, probe_timeout_s=2.0) as (
        wc,
        address,
    ):
        t0 = time.perf_counter()
        reply = await wc.create("n0", address, create_req("slow-1"), timeout_s=10.0)
        assert reply.instance.instance_id == "slow-1"
        assert time.perf_counter() - t0 >= 0.5
        assert wc.probes >= 1  # checked while it started, and it answered
        assert len(wc.watch) == 0


async def test_a_start_on_an_agent_that_answers_probes_late_is_not_given_up() -> None:
    # Probes while it starts, each answered 0.3 s after it was sent: past
    # probe_timeout_s (the earlier rule gave the start up).
    async with agent_with(StarvedAgent, 0.8, check_s=0.05, probe_timeout_s=0.1) as (wc, address):
        reply = await wc.create("n0", address, create_req("late-1"), timeout_s=20.0)
        assert reply.instance.instance_id == "late-1"
        assert wc.watch.late_answers >= 1  # (answered late, and it waited on)
        assert len(wc.watch) == 0


async def test_a_create_to_an_agent_that_answers_nothing_is_given_up() -> None:
    agent = SilentAgent()
    server, address = await serve(agent)
    pool = rpc.ChannelPool()
    calls = AgentCalls(lambda: pool)
    # Its probe waits for a late answer at most patience_s (the create's own
    # limit, 30 s, is longer).
    wc = CountingCreates(calls, lambda: pool, check_s=0.1, probe_timeout_s=0.3, patience_s=0.6)
    try:
        with pytest.raises(NodeLost) as lost:
            await asyncio.wait_for(wc.create("n0", address, create_req("x-1"), 30.0), 10.0)
        assert lost.value.reason == NO_ANSWER and lost.value.node_id == "n0"
        assert wc.probes == 1 and len(wc.watch) == 0
        await asyncio.wait_for(agent.gone.wait(), 5.0)  # the call was cancelled
    finally:
        await wc.close()
        await calls.close()
        await pool.close()
        await server.stop(None)
