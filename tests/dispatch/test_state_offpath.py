"""State is off the critical path: dispatch and cold starts work while etcd
is down, the records land once it is back, and a restarted Dispatch rebuilds
its view from those records plus the node agents. All against a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.runtime.revisions import routing_key
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from statestore import open_store
from tests.cluster import InProcessCluster, eventually
from tests.etcd_server import EtcdServer, require_etcd
from tests.runtimes import deploy

pytestmark = pytest.mark.etcd


@pytest.fixture
async def etcd(tmp_path):
    require_etcd()
    server = EtcdServer(tmp_path / "etcd")
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def start_cluster(url: str) -> InProcessCluster:
    c = InProcessCluster()
    await c.add("controller", "controller", "--state", url)
    await c.add("clustermgr", "clustermgr-0", "--state", url)
    await c.add("schedule", "schedule-0")
    await c.add("dispatch", "d-0", "--state", url)
    await c.add(
        "nodeagent", "agent-0", "--nodes", "3", "--sandbox", "emulated", "--heartbeat-ms", "50"
    )
    await eventually(
        lambda: len(c.parts["schedule-0"].component.servicer.policy) == 3,
        what="nodes reach Schedule",
    )
    return c


async def keys(url: str, prefix: str) -> list[str]:
    store = open_store(url)
    try:
        return [kv.key for kv in await store.get_prefix(prefix)]
    finally:
        await store.close()


@pytest.mark.slow
async def test_cold_starts_while_etcd_is_down_then_records_land(etcd):
    cluster = await start_cluster(etcd.url)
    try:
        async with GalaxyClient(cluster.controller) as c:
            names = [f"f-{i}" for i in range(5)]
            for n in names:
                await deploy(c, common_pb2.FunctionSpec(name=n, command=["x"]))
            await asyncio.to_thread(etcd.stop)
            got = [await c.dispatch(n) for n in names]  # cold starts, etcd down
            assert all(a.cold_start for a in got)
            warm = await c.dispatch(names[0])
            assert warm.instance_id == got[0].instance_id or warm.cold_start
            # Deploying is durable, so it must fail clearly while etcd is down.
            with pytest.raises(Exception, match=r"state store unavailable"):
                await deploy(c, common_pb2.FunctionSpec(name="late", command=["x"]))
            await asyncio.to_thread(etcd.start)
            for part in ("d-0", "clustermgr-0"):
                writer = cluster.parts[part].component.recorder.writer
                await asyncio.wait_for(writer.flush(), 30)
            recorded = await keys(etcd.url, "/galaxy/instances/")
            assert {f"/galaxy/instances/{a.function}/{a.instance_id}" for a in got} <= set(recorded)
            assert len(await keys(etcd.url, "/galaxy/nodes/")) == 3
    finally:
        await cluster.close()


@pytest.mark.slow
async def test_restarted_dispatch_rebuilds_its_view_warm(etcd):
    cluster = await start_cluster(etcd.url)
    try:
        async with GalaxyClient(cluster.controller) as c:
            await deploy(c, common_pb2.FunctionSpec(name="keep", command=["x"], concurrency=2))
            await deploy(c, common_pb2.FunctionSpec(name="gone", command=["x"]))
            first = await c.dispatch("keep")
            await c.release(first)
            lost = await c.dispatch("gone")
            await c.release(lost)
            await cluster.remove("d-0")  # flushes its records on the way out
            # An instance that dies while no Dispatch watches must not come back.
            agent = cluster.parts["agent-0"].address
            async with c.pool.stub(agent, nodeagent_pb2_grpc.NodeAgentStub) as s:
                await s.DeleteInstance(
                    nodeagent_pb2.DeleteInstanceRequest(
                        node_id=lost.node_id, instance_id=lost.instance_id
                    )
                )
            d0 = await cluster.add("dispatch", "d-0", "--state", etcd.url)
            c.membership = type(c.membership)()
            again = await c.dispatch("keep")
            assert not again.cold_start and again.instance_id == first.instance_id
            servicer = d0.component.dispatcher
            assert not [f for f in servicer.ownership.recovered if routing_key(f) == "gone"]
            assert not servicer.routes("gone")
            await asyncio.wait_for(d0.component.recorder.writer.flush(), 30)
            # The function's records, whichever revision (gone-NNNNN) they are of.
            assert not await keys(etcd.url, "/galaxy/instances/gone")
            fresh = await c.dispatch("gone")
            assert fresh.cold_start and fresh.instance_id != lost.instance_id
    finally:
        await cluster.close()
