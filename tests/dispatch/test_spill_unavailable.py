"""A scale-up spills past a Schedule instance that cannot be reached (it
died; the membership still lists it) to the next one in rendezvous order."""

from __future__ import annotations

import socket

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, controller_pb2_grpc
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy

SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.slow
async def test_scale_up_spills_past_an_unreachable_schedule_instance() -> None:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-live")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "6", "--sandbox", "emulated")
        async with GalaxyClient(c.controller) as client:
            dead = common_pb2.ControlInstance(id="s-dead", kind=SCHEDULE, address=_dead_address())
            async with client.pool.stub(c.controller, controller_pb2_grpc.ControllerStub) as s:
                await s.RegisterInstance(dead)
            dispatch = c.parts["d-0"].component.dispatcher
            await eventually(
                lambda: "s-dead" in dispatch.membership.ids(SCHEDULE), what="membership"
            )
            live = c.parts["s-live"].component.servicer.policy
            await eventually(lambda: len(live) > 0, what="the live Schedule holds nodes")
            # A function whose scale-ups go to the dead instance first.
            name = next(
                f"fn-{i}"
                for i in range(1000)
                if dispatch.membership.ranked(SCHEDULE, f"fn-{i}")[0].id == "s-dead"
            )
            await deploy(client, common_pb2.FunctionSpec(name=name, command=["x"]))
            got = await client.dispatch(name, deadline_s=10.0)
            assert got.cold_start and got.instance_id
            await client.release(got)
    finally:
        await c.close()
