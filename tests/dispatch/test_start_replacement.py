"""A start that fails for good gives its share of the waiters back: when the
starts still under way do not cover them, Dispatch starts a replacement at
once, not at the next request (which may never come) or the next
autoscaler round.

Schedule here is a real gRPC server on a real socket: it refuses the first
placement (no room) and holds the others until the test lets them go.
"""

from __future__ import annotations

import asyncio

import grpc

from functions.dispatch.policy import Grant
from galaxy.v1 import common_pb2, schedule_pb2, schedule_pb2_grpc
from tests.dispatch.schedstub import dispatch_with_schedule, placed


class FirstRefused(schedule_pb2_grpc.ScheduleServicer):
    """Refuses the first placement with RESOURCE_EXHAUSTED; places the
    others once ``go`` is set."""

    def __init__(self, want: int) -> None:
        self.ids: list[str] = []
        self.want = want
        self.asked = asyncio.Event()  # ``want`` distinct ids asked for
        self.go = asyncio.Event()

    async def Schedule(
        self, request: schedule_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ScheduleReply:
        first = not self.ids
        self.ids.append(request.instance_id)
        if len(set(self.ids)) >= self.want:
            self.asked.set()
        if first:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room on any node")
        await self.go.wait()
        return placed(request)


async def test_a_failed_start_is_replaced_for_the_waiters_it_covered() -> None:
    sched = FirstRefused(want=3)
    async with dispatch_with_schedule(sched) as svc:
        spec = common_pb2.FunctionSpec(
            name="f", concurrency=1, max_scale=3, startup_timeout_ms=30_000
        )
        router = svc.dispatcher.router(spec)
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Grant]] = [loop.create_future() for _ in range(2)]
        for fut in futs:
            router.enqueue(fut)
        svc.dispatcher.trigger_scale_up(router, spec)  # two starts, one per waiter
        # The refused one is replaced under a new id, with no new request.
        await asyncio.wait_for(sched.asked.wait(), 10.0)
        assert router.pending == 2 and router.live_count() == 0
        sched.go.set()
        grants = await asyncio.wait_for(asyncio.gather(*futs), 10.0)
        assert {g.instance.instance_id for g in grants} == set(sched.ids[1:])
        assert len(set(sched.ids)) == 3
