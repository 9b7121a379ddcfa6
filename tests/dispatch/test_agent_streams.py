"""Dispatch and Schedule send CreateInstance and DeleteInstance over one
NodeAgent.InstanceStream per agent (controlplane.runtime.agent_streams) in a
real in-process cluster on loopback gRPC: a cold start from a credit
(Dispatch -> agent), one through Schedule (--no-credits), and the deletes
of a removed function; with --no-agent-streams the same as unary calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy

SPEC = common_pb2.FunctionSpec(
    name="f", command=["x"], concurrency=1, max_scale=8,
    resources=common_pb2.Resources(cpu_millis=100, memory_mib=64),
)  # fmt: skip


def _count(method: str) -> float:
    labels = {"method": method, "code": "OK"}
    return REGISTRY.get_sample_value("galaxy_rpc_requests_total", labels) or 0.0


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[InProcessCluster]:
    """Flags for every component (indirect parameter): e.g. --no-credits."""
    flags: list[str] = list(getattr(request, "param", []))
    credits = [f for f in flags if f == "--no-credits"]
    rpc_flags = [f for f in flags if f != "--no-credits"]
    c = InProcessCluster()
    try:
        await c.add("controller", "controller", *rpc_flags)
        await c.add("clustermgr", "cm-0", "--heartbeat-ms", "100", *rpc_flags)
        await c.add("schedule", "s-0", *credits, *rpc_flags)
        await c.add("dispatch", "d-0", "--no-autoscale", *credits, *rpc_flags)
        await c.add(
            "nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated",
            "--heartbeat-ms", "100", *rpc_flags,
        )  # fmt: skip
        sched = c.parts["s-0"].component.servicer
        await eventually(lambda: len(sched.policy) == 2, what="both nodes in the partition")
        yield c
    finally:
        await c.close()


def _calls(c: InProcessCluster) -> tuple[Any, Any]:
    """(Dispatch's AgentCalls, Schedule's)."""
    return c.parts["d-0"].component.dispatcher.peers.agents, c.parts[
        "s-0"
    ].component.servicer.agents


async def _cold_start_then_delete(c: InProcessCluster) -> None:
    agent = c.parts["agent-0"].component.servicer
    async with GalaxyClient(c.controller) as client:
        await deploy(client, SPEC)
        got = await client.dispatch("f")
        assert got.cold_start
        await client.release(got)
        assert sum(len(n.instances) for n in agent.nodes.values()) == 1
        await client.delete_function("f")
    await eventually(
        lambda: not any(n.instances for n in agent.nodes.values()), what="the instance deleted"
    )


@pytest.mark.parametrize(
    "cluster", [[], ["--no-credits"]], indirect=True, ids=["credits", "schedule"]
)
async def test_cold_starts_and_deletes_travel_on_the_stream(cluster) -> None:
    created, deleted = _count("NodeAgent/CreateInstance"), _count("NodeAgent/DeleteInstance")
    await _cold_start_then_delete(cluster)
    dispatch, schedule = _calls(cluster)
    creator = (
        schedule if cluster.parts["d-0"].component.dispatcher.peers.credits is None else dispatch
    )
    assert creator.sent["stream"] >= 1 and creator.sent["unary"] == 0
    assert dispatch.sent["unary"] == 0 and schedule.sent["unary"] == 0
    assert creator.opened == 1
    # Counted under the unary methods' names, as a unary call is.
    assert _count("NodeAgent/CreateInstance") == created + 1
    assert _count("NodeAgent/DeleteInstance") == deleted + 1


@pytest.mark.parametrize("cluster", [["--no-agent-streams"]], indirect=True)
async def test_without_agent_streams_the_calls_are_unary(cluster) -> None:
    created = _count("NodeAgent/CreateInstance")
    await _cold_start_then_delete(cluster)
    dispatch, schedule = _calls(cluster)
    assert dispatch.sent["stream"] == 0 and schedule.sent["stream"] == 0
    assert dispatch.sent["unary"] + schedule.sent["unary"] >= 2
    assert dispatch.opened == 0 and schedule.opened == 0
    assert _count("NodeAgent/CreateInstance") == created + 1
