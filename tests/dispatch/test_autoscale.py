"""Function autoscaling through real components: an idle function scales to
zero (removed from Dispatch before it is deleted on the node) and cold-starts
again on the next request; min_scale instances start without a request."""

from __future__ import annotations

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from tests.cluster import InProcessCluster, eventually, eventually_async
from tests.runtimes import deploy

FAST = ("--autoscale-tick-ms", "50", "--stable-window-s", "0.5", "--scale-to-zero-grace-s", "0.3")


@pytest.fixture
async def cluster():
    c = InProcessCluster()
    await c.add("controller", "controller")
    await c.add("clustermgr", "clustermgr-0")
    await c.add("schedule", "schedule-0")
    await c.add("dispatch", "d-0", *FAST)
    await c.add(
        "nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated", "--heartbeat-ms", "50"
    )
    await eventually(lambda: len(c.parts["schedule-0"].component.servicer.policy) == 2)
    try:
        yield c
    finally:
        await c.close()


async def on_nodes(c: GalaxyClient, cluster: InProcessCluster) -> set[str]:
    agent = cluster.parts["agent-0"]
    out: set[str] = set()
    async with c.pool.stub(agent.address, nodeagent_pb2_grpc.NodeAgentStub) as s:
        for node in ("node-0", "node-1"):
            r = await s.ListNodeInstances(nodeagent_pb2.ListNodeInstancesRequest(node_id=node))
            out |= {i.instance_id for i in r.instances}
    return out


async def test_idle_function_scales_to_zero_and_cold_starts_again(cluster):
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="idle", command=["x"], concurrency=1))
        first = await c.dispatch("idle")
        assert first.cold_start
        assert first.instance_id in await on_nodes(c, cluster)
        await c.release(first)
        # Idle past the stable window and grace: retired from Dispatch...
        await eventually(lambda: not d0.router_of("idle").instances, 10, "scale to zero")
        # ...and then deleted on the node.

        async def deleted() -> bool:
            return first.instance_id not in await on_nodes(c, cluster)

        await eventually_async(deleted, 10, "deleted on the node")
        again = await c.dispatch("idle")
        assert again.cold_start and again.instance_id != first.instance_id
        await c.release(again)


@pytest.mark.slow
async def test_busy_instance_is_never_retired(cluster):
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="busy", command=["x"], concurrency=1))
        held = await c.dispatch("busy")
        # Several autoscaler windows pass while the slot is held.
        ticks = d0.autoscaling.settings.tick_s
        await eventually(
            lambda: (
                d0.clock.now() - d0.router_of("busy").instances[held.instance_id].added_at
                > 4 * 0.5 + 10 * ticks
            ),
            10,
        )
        assert held.instance_id in d0.router_of("busy").instances
        await c.release(held)


async def test_min_scale_starts_instances_before_any_request(cluster):
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller) as c:
        await deploy(
            c, common_pb2.FunctionSpec(name="warm", command=["x"], min_scale=2, max_scale=4)
        )
        await eventually(
            lambda: d0.routes("warm") and len(d0.router_of("warm").instances) == 2,
            10,
            "min_scale instances",
        )
        got = await c.dispatch("warm")
        assert not got.cold_start
        await c.release(got)
