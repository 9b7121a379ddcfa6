"""A start under way when its function changes Dispatch owner (real
components in one process, real RPCs): the request waiting for it is served
by it on the old owner, the instance then goes to the new owner with that
lease, and the new owner starts nothing (it used to start a second
instance for the forwarded request; see ``functions/dispatch/ownership``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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


async def test_a_start_under_way_serves_its_waiter_across_a_handover(cluster, monkeypatch, caplog):
    # Dispatch's info lines (why a start began: a request, a rollout, the
    # autoscaler) are shown if it fails.
    caplog.set_level(logging.INFO, logger="functions.dispatch")
    fn = "slow"
    d0 = cluster.parts["d-0"].component.dispatcher
    # Hold the placement's answer until the function has moved.
    gate, placing = asyncio.Event(), asyncio.Event()
    # (Whichever way it is placed: from a credit or through Schedule.)
    for name in ("from_credit", "ask_schedule"):
        place = getattr(d0.peers, name)

        async def gated(*a: Any, place: Any = place, **k: Any) -> Any:
            placing.set()
            await gate.wait()
            return await place(*a, **k)

        monkeypatch.setattr(d0.peers, name, gated)
    async with GalaxyClient(cluster.controller) as c:
        spec = common_pb2.FunctionSpec(name=fn, command=["x"], concurrency=1, max_scale=5)
        await deploy(c, spec)
        await eventually(lambda: len(cluster.parts["schedule-0"].component.servicer.policy) == 4)
        # And d-0 sees it READY (a warming Schedule instance is hidden from
        # Dispatch; the news comes with d-0's next load report). Else the
        # start's first round finds no Schedule instance and, its function
        # handed over meanwhile, is not tried again: its waiter goes to the
        # new owner, which starts one (right, but not the path under test;
        # seen once under CI load).
        await eventually(
            lambda: bool(d0.membership.instances(common_pb2.CONTROL_KIND_SCHEDULE)),
            what="d-0 sees a READY Schedule instance",
        )
        async with c.pool.stub(cluster.parts["d-0"].address, dispatch_pb2_grpc.DispatchStub) as s:
            waiting = asyncio.ensure_future(
                s.Dispatch(dispatch_pb2.DispatchRequest(function=fn), timeout=20)
            )
            await placing.wait()
            assert d0.router_of(fn).pending == 1
            new_id = next(
                f"d-x{i}" for i in range(100) if rendezvous.owner(fn, ["d-0", f"d-x{i}"]) != "d-0"
            )
            d1 = (await cluster.add("dispatch", new_id)).component.dispatcher
            await eventually(
                lambda: not d0.routes(fn) and not d0.ownership.handing_over(fn), what="handover"
            )
            gate.set()
            got = await waiting
        assert got.cold_start
        await eventually(lambda: d1.routes(fn) and got.instance_id in d1.router_of(fn).instances)
        r1 = d1.router_of(fn)
        # One start in all, on the old owner; its slot still held at the new one.
        # (Both counts in the message: a failure seen once under CI load had
        # the new owner start one, which this tells apart from a forward.)
        ops = {"d0": dict(d0.ops), "d1": dict(d1.ops)}
        assert d1.ops["scale_up"] == 0 and d0.ops["scale_up"] == 1, ops
        assert list(r1.instances) == [got.instance_id]
        assert r1.instances[got.instance_id].in_flight == 1
        assert await c.release(got)
        await eventually(lambda: r1.instances[got.instance_id].in_flight == 0, what="release")
