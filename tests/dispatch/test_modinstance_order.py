"""ModInstance(OP_ADD) from a function's previous owner, on the servicer
(no network: the handover message is handed to it directly): the instance's
active leases count before a waiting request is served on it, and an
instance arriving with no room under max_scale takes no new request."""

from __future__ import annotations

import asyncio

from controlplane.runtime import rpc
from functions.dispatch.autoscale import retirable
from functions.dispatch.policy import Grant, Instance
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, dispatch_pb2

OP_ADD = dispatch_pb2.ModInstanceRequest.OP_ADD


def _handed_over(iid: str, leases: list[str]) -> dispatch_pb2.ModInstanceRequest:
    info = common_pb2.InstanceInfo(
        instance_id=iid, function="f", address="127.0.0.1:1", node_id="n0", concurrency=2
    )
    return dispatch_pb2.ModInstanceRequest(
        op=OP_ADD, instance=info, reason="handed over by d0", active_leases=leases
    )


async def test_op_add_adopts_the_old_owners_leases_before_serving_waiters() -> None:
    svc = DispatchServicer(instance_id="d1", pool=rpc.ChannelPool(), controller="")
    try:
        router = svc.dispatcher.router(
            common_pb2.FunctionSpec(name="f", concurrency=2, max_scale=4)
        )
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Grant]] = [loop.create_future() for _ in range(2)]
        for f in futs:
            router.enqueue(f)
        # Both slots of the instance are leased out by the previous owner.
        await svc.ModInstance(_handed_over("i0", ["d0:f/1.a", "d0:f/2.b"]), None)  # type: ignore[arg-type]
        inst = router.instances["i0"]
        assert inst.in_flight == 2 and len(router.leases) == 2
        assert not any(f.done() for f in futs)  # no slot given twice
        # A slot its old lease frees goes to the first waiter.
        assert svc.dispatcher.release("f", "d0:f/1.a")
        assert futs[0].done() and not futs[1].done()
        assert inst.in_flight == 2
    finally:
        await svc.dispatcher.close()


async def test_op_add_with_no_room_under_max_scale_takes_no_new_request() -> None:
    svc = DispatchServicer(instance_id="d1", pool=rpc.ChannelPool(), controller="")
    try:
        router = svc.dispatcher.router(
            common_pb2.FunctionSpec(name="f", concurrency=2, max_scale=1)
        )
        router.add_instance(Instance("mine", "127.0.0.1:3", "n0", 2))
        await svc.ModInstance(_handed_over("i0", ["d0:f/1.a"]), None)  # type: ignore[arg-type]
        assert router.live_count() + router.pending == 1
        assert router.instances["i0"].draining
        got = [router.acquire() for _ in range(3)]  # new requests: only "mine" takes them
        assert [g.instance.instance_id if g else None for g in got] == ["mine", "mine", None]
        svc.dispatcher.release("f", "d0:f/1.a")
        assert retirable(router) == ["i0"]
    finally:
        await svc.dispatcher.close()
