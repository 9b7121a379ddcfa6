"""Node agents stop instances no Dispatch instance routes (orphans), and only
those: the tracker (pure) and a real in-process cluster."""

from __future__ import annotations

import pytest

from controlplane.nodeagent.orphans import OrphanTracker
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from tests.cluster import eventually_async, small_cluster
from tests.runtimes import deploy


def test_an_instance_is_an_orphan_after_two_unknown_checks_past_the_grace() -> None:
    t = OrphanTracker(checks=2, grace_s=10.0)
    running = {"a": 0.0, "b": 0.0, "young": 95.0}
    everyone = set(running)
    assert t.observe(100.0, running, {"a"}, everyone) == []  # b unknown once
    assert t.observe(101.0, running, {"a"}, everyone) == ["b"]
    # young is unknown too, but not ready for grace_s yet.
    assert "young" not in t.observe(102.0, running, {"a"}, everyone)
    # An owner that does not answer judges nothing; known again resets.
    t2 = OrphanTracker(checks=2, grace_s=0.0)
    assert t2.observe(1.0, {"c": 0.0}, set(), set()) == []
    assert t2.observe(2.0, {"c": 0.0}, set(), {"c"}) == []  # first unknown answer
    assert t2.observe(3.0, {"c": 0.0}, {"c"}, {"c"}) == []  # handed over: known
    assert t2.observe(4.0, {"c": 0.0}, set(), {"c"}) == []  # count restarted
    assert t2.observe(5.0, {"c": 0.0}, set(), {"c"}) == ["c"]


@pytest.mark.slow
async def test_the_agent_stops_an_orphan_and_keeps_what_dispatch_routes() -> None:
    c = await small_cluster("--nodes", "1", "--sandbox", "emulated", "--orphan-check-s", "0.2")
    try:
        agent = c.parts["agent-0"]
        async with GalaxyClient(c.controller) as client:
            await deploy(client, common_pb2.FunctionSpec(name="f", command=["x"], min_scale=1))
            kept = await client.dispatch("f")
            await client.release(kept)
            async with client.pool.stub(agent.address, nodeagent_pb2_grpc.NodeAgentStub) as s:
                spec = await client.get_function(kept.function)
                await s.CreateInstance(
                    nodeagent_pb2.CreateInstanceRequest(
                        node_id=kept.node_id, instance_id="orphan-1", function=spec
                    )
                )

                async def on_node() -> set[str]:
                    r = await s.ListNodeInstances(
                        nodeagent_pb2.ListNodeInstancesRequest(node_id=kept.node_id)
                    )
                    return {i.instance_id for i in r.instances}

                assert {"orphan-1", kept.instance_id} <= await on_node()

                async def reaped() -> bool:
                    return "orphan-1" not in await on_node()

                await eventually_async(reaped, 15, "orphan stopped")
                assert kept.instance_id in await on_node()
    finally:
        await c.close()
