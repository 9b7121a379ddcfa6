"""Without streams (``GalaxyClient(streams=False)``), deferred releases ride
on the next Dispatch call to the same owner (one RPC per request instead of
two), or go on their own shortly after. With streams they are messages on
the stream: tests/dispatch/test_dispatch_stream.py."""

from __future__ import annotations

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy


@pytest.fixture
async def cluster():
    c = InProcessCluster()
    await c.add("controller", "controller")
    await c.add("clustermgr", "clustermgr-0")
    await c.add("schedule", "schedule-0")
    await c.add("dispatch", "d-0", "--no-autoscale")
    await c.add("nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated")
    await eventually(lambda: len(c.parts["schedule-0"].component.servicer.policy) == 2)
    try:
        yield c
    finally:
        await c.close()


async def test_deferred_release_frees_the_slot_for_the_next_request(cluster):
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller, streams=False) as c:
        await deploy(
            c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=1, max_scale=3)
        )
        first = await c.dispatch("f")
        assert await c.release(first, defer=True)
        assert d0.router_of("f").instances[first.instance_id].in_flight == 1  # not yet
        second = await c.dispatch("f")  # carries the release
        assert not second.cold_start and second.instance_id == first.instance_id
        assert len(d0.router_of("f").instances) == 1
        await c.release(second, defer=True)
        # No call to ride on: the flush timer sends it.
        await eventually(
            lambda: d0.router_of("f").instances[first.instance_id].in_flight == 0, 5, "timed flush"
        )


async def test_close_sends_deferred_releases(cluster):
    d0 = cluster.parts["d-0"].component.dispatcher
    c = GalaxyClient(cluster.controller, streams=False)
    await deploy(c, common_pb2.FunctionSpec(name="g", command=["x"], concurrency=1))
    got = await c.dispatch("g")
    await c.release(got, defer=True)
    await c.close()
    assert d0.router_of("g").instances[got.instance_id].in_flight == 0
