"""The controller judges a deploy against the nodes ClusterMgr knows, in a
real in-process cluster: a spec no registered node could place is
FAILED_PRECONDITION, and one namespace's min_scale may hold at most the
default share of the nodes' capacity (RESOURCE_EXHAUSTED naming it). Before
any node registered, neither refuses."""

from __future__ import annotations

import pytest

from controlplane.runtime.errors import FailedPrecondition, ResourceExhausted
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, eventually_async, small_cluster
from tests.runtimes import deploy


def spec(name: str, cpu: int = 250, gpus: int = 0, min_scale: int = 0):
    return common_pb2.FunctionSpec(
        name=name,
        command=["x"],
        min_scale=min_scale,
        resources=common_pb2.Resources(cpu_millis=cpu, memory_mib=64, gpus=gpus),
    )


@pytest.fixture
async def one_node():
    """A cluster of one emulated node (4,000 millicores, no GPU), registered."""
    c = await small_cluster()
    try:
        async with GalaxyClient(c.controller) as client:

            async def registered() -> bool:
                return len((await client.status()).nodes) == 1

            await eventually_async(registered, what="the node registered")
        yield c
    finally:
        await c.close()


async def test_deploy_is_judged_against_the_registered_nodes(one_node) -> None:
    async with GalaxyClient(one_node.controller) as client:
        with pytest.raises(FailedPrecondition) as e:
            await deploy(client, spec("gpu", gpus=2))
        assert e.value.message.startswith(
            "resources.gpus: 2 per instance, but the largest of the 1 registered node has 0"
        )
        with pytest.raises(FailedPrecondition) as e:
            await deploy(client, spec("wide", cpu=4001))
        assert "resources.cpu_millis: 4001" in e.value.message and "has 4000" in e.value.message
        # min_scale 9 x 250 m = 2,250 m: over half of 4,000.
        with pytest.raises(ResourceExhausted) as e2:
            await deploy(client, spec("hog", min_scale=9))
        assert e2.value.message.startswith(
            "default quota cpu_millis of namespace default (0.5 of the registered nodes): 2000"
        )
        await deploy(client, spec("fits", min_scale=8))
        names = {f.name for f in await client.list_functions()}
        assert names == {"fits"}


@pytest.fixture
async def no_node():
    """A controller and a ClusterMgr that knows no node yet."""
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        yield c
    finally:
        await c.close()


async def test_before_any_node_registers_nothing_is_refused_for_its_size(no_node) -> None:
    async with GalaxyClient(no_node.controller) as client:
        await deploy(client, spec("gpu", gpus=2))
        await deploy(client, spec("hog", min_scale=9))
