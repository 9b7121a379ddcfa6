"""Dispatch repartitioning: when a Dispatch instance joins, functions that now
hash to it are handed over with their instances and reserved slots, so no
cold start is repeated and no slot is double-booked."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.runtime import rendezvous
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy


@pytest.fixture
async def cluster():
    c = InProcessCluster()
    await c.add("controller", "controller")
    await c.add("clustermgr", "clustermgr-0")
    await c.add("schedule", "schedule-0")
    await c.add("dispatch", "d-0")
    await c.add(
        "nodeagent", "agent-0", "--nodes", "4", "--sandbox", "emulated", "--heartbeat-ms", "50"
    )
    try:
        yield c
    finally:
        await c.close()


def spec(name: str) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(name=name, command=["x"], concurrency=1, max_scale=5)


async def test_new_dispatch_instance_takes_over_its_functions_warm(cluster):
    names = [f"f-{i}" for i in range(12)]
    moved = [n for n in names if rendezvous.owner(n, ["d-0", "d-1"]) == "d-1"]
    assert moved, "hash should send some functions to d-1"
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller) as c:
        for n in names:
            await deploy(c, spec(n))
        await eventually(
            lambda: len(cluster.parts["schedule-0"].component.servicer.policy) == 4,
            what="nodes reach Schedule",
        )
        first = {n: await c.dispatch(n) for n in names}
        assert all(a.cold_start for a in first.values())
        # Keep the slot of moved[0] reserved across the handover.
        held = first[moved[0]]
        for n in names:
            if n != moved[0]:
                await c.release(first[n])

        d1 = (await cluster.add("dispatch", "d-1")).component.dispatcher
        await eventually(
            lambda: all(d1.routes(n) for n in moved) and not any(d0.routes(n) for n in moved),
            what="handover",
        )
        c.membership = type(c.membership)()  # the SDK re-learns owners
        for n in moved[1:]:
            again = await c.dispatch(n)
            assert not again.cold_start and again.instance_id == first[n].instance_id
            await c.release(again)
        # The held slot was handed over: concurrency 1 means the next request
        # must wait for it (or start a second instance), never share it.
        nxt = await c.dispatch(moved[0])
        assert nxt.instance_id != held.instance_id or nxt.cold_start
        assert d1.router_of(moved[0]).instances[held.instance_id].in_flight == 1
        assert await c.release(held)


async def test_waiting_request_follows_its_function_to_the_new_owner(cluster):
    async with GalaxyClient(cluster.controller) as c:
        await deploy(
            c, common_pb2.FunctionSpec(name="solo", command=["x"], concurrency=1, max_scale=1)
        )
        await eventually(lambda: len(cluster.parts["schedule-0"].component.servicer.policy) == 4)
        d0 = cluster.parts["d-0"]
        async with c.pool.stub(d0.address, dispatch_pb2_grpc.DispatchStub) as s:
            busy = await s.Dispatch(dispatch_pb2.DispatchRequest(function="solo"))
            waiting = asyncio.ensure_future(
                s.Dispatch(dispatch_pb2.DispatchRequest(function="solo"), timeout=20)
            )
            await eventually(lambda: d0.component.servicer.router_of("solo").waiters)
            # Force "solo" onto the new instance by picking an id it hashes to.
            new_id = next(
                f"d-x{i}"
                for i in range(100)
                if rendezvous.owner("solo", ["d-0", f"d-x{i}"]) == f"d-x{i}"
            )
            d1 = (await cluster.add("dispatch", new_id)).component.dispatcher
            await eventually(lambda: d1.routes("solo"), what="handover")
            assert not waiting.done()
            await c.release(busy)  # the SDK routes the release to the new owner
            got = await waiting
        assert got.instance_id == busy.instance_id and not got.cold_start
