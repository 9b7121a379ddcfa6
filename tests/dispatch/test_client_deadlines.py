"""A Dispatch call that its client cancels or times out never strands a
slot, and a retried request id gets the same lease. Real gRPC."""

from __future__ import annotations

import asyncio

import grpc

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy


async def _cluster() -> InProcessCluster:
    c = InProcessCluster()
    await c.add("controller", "controller")
    await c.add("clustermgr", "cm-0")
    await c.add("schedule", "s-0")
    await c.add("dispatch", "d-0")
    await c.add("nodeagent", "agent-0", "--nodes", "1", "--sandbox", "emulated")
    return c


async def test_timed_out_dispatch_calls_hold_no_slot() -> None:
    c = await _cluster()
    try:
        async with GalaxyClient(c.controller) as client:
            await deploy(
                client, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=4, max_scale=1)
            )
            warm = await client.dispatch("f")
            await client.release(warm)
            router = c.parts["d-0"].component.servicer.router_of("f")
            d0 = c.parts["d-0"].address
            async with client.pool.stub(d0, dispatch_pb2_grpc.DispatchStub) as s:
                results = await asyncio.gather(
                    *(
                        s.Dispatch(dispatch_pb2.DispatchRequest(function="f"), timeout=0.002)
                        for _ in range(8)
                    ),
                    return_exceptions=True,
                )
            timed_out = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            granted = [r for r in results if isinstance(r, dispatch_pb2.InstanceAddr)]
            for g in granted:  # answers that did arrive are released by their caller
                await client.release(g)
            assert timed_out, "no call timed out: the test shows nothing"
            # Every slot reserved for a caller that gave up is back.
            await eventually(
                lambda: sum(i.in_flight for i in router.instances.values()) == 0,
                within_s=5.0,
                what="slots of timed-out calls released",
            )
            again = await client.dispatch("f", deadline_s=5.0)
            assert again.instance_id == warm.instance_id
            await client.release(again)
    finally:
        await c.close()


async def test_timed_out_calls_during_a_cold_start_hold_no_slot() -> None:
    c = await _cluster()
    try:
        async with GalaxyClient(c.controller) as client:
            await deploy(
                client,
                common_pb2.FunctionSpec(name="cold", command=["x"], concurrency=4, max_scale=1),
            )
            d0 = c.parts["d-0"].address
            async with client.pool.stub(d0, dispatch_pb2_grpc.DispatchStub) as s:
                results = await asyncio.gather(
                    *(
                        s.Dispatch(dispatch_pb2.DispatchRequest(function="cold"), timeout=0.002)
                        for _ in range(8)
                    ),
                    return_exceptions=True,
                )
            assert all(isinstance(r, grpc.aio.AioRpcError) for r in results)
            # The instance the first call started arrives after they all gave up.
            got = await client.dispatch("cold", deadline_s=10.0)
            router = c.parts["d-0"].component.servicer.router_of("cold")
            assert sum(i.in_flight for i in router.instances.values()) == 1  # just this one
            await client.release(got)
    finally:
        await c.close()


async def test_the_same_request_id_gets_the_same_lease() -> None:
    c = await _cluster()
    try:
        async with GalaxyClient(c.controller) as client:
            await deploy(
                client, common_pb2.FunctionSpec(name="g", command=["x"], concurrency=4, max_scale=1)
            )
            a = await client.dispatch("g", request_id="req-1")
            b = await client.dispatch("g", request_id="req-1")
            assert (a.lease_id, a.instance_id) == (b.lease_id, b.instance_id)
            router = c.parts["d-0"].component.servicer.router_of("g")
            assert sum(i.in_flight for i in router.instances.values()) == 1
            other = await client.dispatch("g", request_id="req-2")
            assert other.lease_id != a.lease_id
            await client.release(a)
            await client.release(other)
            await eventually(
                lambda: sum(i.in_flight for i in router.instances.values()) == 0,
                what="released",
            )
    finally:
        await c.close()
