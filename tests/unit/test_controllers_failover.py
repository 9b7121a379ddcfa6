"""Several controller addresses (`galaxy up --ha`): a caller passes over a
controller that is down or answers UNAVAILABLE, and keeps to the one that
answered; the SDK takes a list or a comma-separated string."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.launch.etcd import free_port
from controlplane.runtime import controllers, rpc
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.errors import Unavailable
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from tests.controller.conftest import serve


class StandIn(controller_pb2_grpc.ControllerServicer):
    """Answers GetMembership, or UNAVAILABLE like a follower mid-election."""

    def __init__(self, epoch: int, up: bool = True) -> None:
        self.epoch = epoch
        self.up = up
        self.calls = 0

    async def GetMembership(self, request, context):
        self.calls += 1
        if not self.up:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no controller leads right now")
        return common_pb2.Membership(epoch=self.epoch)


@pytest.fixture
async def two():
    a, b = StandIn(1, up=False), StandIn(2)
    servers = [
        await serve(controller_pb2_grpc.add_ControllerServicer_to_server, s, "galaxy.v1.Controller")
        for s in (a, b)
    ]
    yield a, b, [addr for _, addr in servers]
    for server, _ in servers:
        await server.stop(None)


def test_split_drops_blanks_and_keeps_order() -> None:
    assert controllers.split(" h:1, ,h:2,") == ["h:1", "h:2"]
    assert controllers.split(["h:2", "h:1"]) == ["h:2", "h:1"]


async def test_call_passes_over_unavailable_and_dead_controllers_and_remembers(two) -> None:
    a, b, (addr_a, addr_b) = two
    dead = f"127.0.0.1:{free_port()}"
    addrs = f"{dead},{addr_a},{addr_b}"
    pool = rpc.ChannelPool(RpcConfig(deadline_s=2.0))
    try:
        req = controller_pb2.GetMembershipRequest()
        m = await controllers.call(pool, addrs, "GetMembership", req, timeout_s=2.0)
        assert m.epoch == 2 and a.calls == 1
        # The one that answered is asked first from now on.
        assert controllers.ordered(addrs)[0] == addr_b
        await controllers.call(pool, addrs, "GetMembership", req, timeout_s=2.0)
        assert (a.calls, b.calls) == (1, 2)
        # UNAVAILABLE from every one: the last error is raised.
        b.up = False
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await controllers.call(pool, addrs, "GetMembership", req, timeout_s=2.0)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await pool.close()


async def test_sdk_takes_several_controllers(two) -> None:
    _, b, (addr_a, addr_b) = two
    async with GalaxyClient([addr_a, addr_b], timeout=2.0) as c:
        assert c.controller == f"{addr_a},{addr_b}"
        await c.refresh_membership()
        assert c.membership.epoch == 2
        # No controller answers (an election): a read is retried for a while...
        b.up = False
        with pytest.raises(Unavailable):
            await c.refresh_membership(retry_s=0.3)
        assert b.calls > 2
        # ...and succeeds once one answers again.
        asyncio.get_running_loop().call_later(0.2, setattr, b, "up", True)
        await c.refresh_membership()
        assert c.membership.epoch == 2
    with pytest.raises(ValueError):
        GalaxyClient(" , ")
