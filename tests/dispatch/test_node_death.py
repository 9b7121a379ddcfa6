"""A node that dies takes its instances out of Dispatch's routing: ClusterMgr
detects the silence and tells every Dispatch instance; waiting requests get a
replacement instance on a live node."""

from __future__ import annotations

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy


@pytest.mark.slow
async def test_instances_on_a_dead_node_stop_being_routed():
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "clustermgr-0", "--heartbeat-ms", "50", "--dead-after-ms", "1000")
        await c.add("schedule", "schedule-0")
        d0 = (await c.add("dispatch", "d-0", "--no-autoscale")).component.dispatcher
        for i in range(2):
            await c.add(
                "nodeagent",
                f"agent-{i}",
                "--nodes",
                "1",
                "--node-index-start",
                str(i),
                "--sandbox",
                "emulated",
                "--heartbeat-ms",
                "50",
                "--cpu-millis",
                "1000",
            )
        await eventually(lambda: len(c.parts["schedule-0"].component.servicer.policy) == 2)
        async with GalaxyClient(c.controller) as client:
            # 1000m nodes, 600m instances: one instance per node.
            await deploy(
                client,
                common_pb2.FunctionSpec(
                    name="f",
                    command=["x"],
                    concurrency=1,
                    max_scale=2,
                    resources=common_pb2.Resources(cpu_millis=600, memory_mib=64),
                ),
            )
            a = await client.dispatch("f")
            b = await client.dispatch("f")
            assert {a.node_id, b.node_id} == {"node-0", "node-1"}
            victim = a if a.node_id == "node-1" else b
            survivor = b if victim is a else a
            await c.remove("agent-1")  # node-1 goes silent
            await eventually(
                lambda: victim.instance_id not in d0.router_of("f").instances,
                10,
                "dead node's instance dropped",
            )
            assert survivor.instance_id in d0.router_of("f").instances
            await client.release(survivor)
            again = await client.dispatch("f")
            assert again.node_id == "node-0"
            await client.release(again)
    finally:
        await c.close()
