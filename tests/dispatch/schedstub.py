"""A Dispatch instance whose only Schedule instance is a given servicer on a
real gRPC server (a real socket on port 0), for the tests of how Dispatch
starts instances; and the reply of a Schedule that placed a start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controlplane.runtime import rpc
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, schedule_pb2, schedule_pb2_grpc


def placed(request: schedule_pb2.ScheduleRequest) -> schedule_pb2.ScheduleReply:
    """The reply of a Schedule that placed ``request`` on node n0."""
    info = common_pb2.InstanceInfo(
        instance_id=request.instance_id,
        function=request.function.name,
        node_id="n0",
        address="127.0.0.1:1",
        node_address="127.0.0.1:2",
    )
    return schedule_pb2.ScheduleReply(instance=info, schedule_id="s0")


@asynccontextmanager
async def dispatch_with_schedule(
    sched: schedule_pb2_grpc.ScheduleServicer,
) -> AsyncIterator[DispatchServicer]:
    """Dispatch "d0" with ``sched`` as Schedule "s0"; all closed on exit."""
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(schedule_pb2_grpc.add_ScheduleServicer_to_server, sched, "x")]
    )
    await server.start()
    pool = rpc.ChannelPool()
    svc = DispatchServicer(instance_id="d0", pool=pool, controller="")
    try:
        s0 = common_pb2.ControlInstance(
            id="s0", kind=common_pb2.CONTROL_KIND_SCHEDULE, address=f"127.0.0.1:{port}"
        )
        svc.dispatcher.membership.update(common_pb2.Membership(epoch=1, instances=[s0]))
        yield svc
    finally:
        await svc.dispatcher.close()
        await pool.close()
        await server.stop(None)
