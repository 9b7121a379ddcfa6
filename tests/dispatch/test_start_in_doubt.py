"""A scale-up whose Schedule call runs past its deadline is in doubt: the
placement goes on (Schedule runs it as its own task) and its instance will
run. Dispatch tries it again under the same instance id, which Schedule
joins, instead of giving the slot back and starting a second instance
beside the first (past max_scale until the orphan checks stopped one).

Schedule here is a real gRPC server on a real socket that answers the first
call for an id only after the caller's deadline, as a loaded one does; so
is the node agent a start from a capacity credit goes to.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.runtime import rpc
from controlplane.runtime.credits import Grant as CreditGrant
from controlplane.runtime.errors import GalaxyError, Unavailable
from controlplane.runtime.resources import Res
from functions.dispatch import peers, starts
from functions.dispatch.credits import CreditWallet
from functions.dispatch.policy import Grant
from galaxy.v1 import (
    common_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)
from tests.dispatch.schedstub import dispatch_with_schedule, placed


class LateSchedule(schedule_pb2_grpc.ScheduleServicer):
    """Places every id it is asked for; answers the first call only after
    the caller gave up (a placement that goes on regardless)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.first_gone = asyncio.Event()

    async def Schedule(
        self, request: schedule_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ScheduleReply:
        self.calls.append(request.instance_id)
        if len(self.calls) == 1:
            context.add_done_callback(lambda _: self.first_gone.set())
            await asyncio.Event().wait()  # answered after the deadline: never, here
        return placed(request)


async def test_a_start_past_its_deadline_is_retried_under_the_same_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peers, "SCHEDULE_SLACK_S", 0.3)  # the Schedule call's deadline
    monkeypatch.setattr(starts, "START_RETRY_S", 0.01)
    sched = LateSchedule()
    async with dispatch_with_schedule(sched) as svc:
        spec = common_pb2.FunctionSpec(name="f", concurrency=1, max_scale=1, startup_timeout_ms=1)
        router = svc.dispatcher.router(spec)
        loop = asyncio.get_running_loop()
        grant: Grant | None = None
        for _ in range(2):  # the caller tries again if its request failed
            fut: asyncio.Future[Grant] = loop.create_future()
            router.enqueue(fut)
            svc.dispatcher.trigger_scale_up(router, spec)
            try:
                grant = await asyncio.wait_for(fut, 10.0)
                break
            except GalaxyError:
                continue
        await asyncio.wait_for(sched.first_gone.wait(), 10.0)
        # One instance id placed: no second instance beside the first.
        assert len(set(sched.calls)) == 1 and len(sched.calls) == 2
        assert grant is not None and grant.instance.instance_id == sched.calls[0]
        assert router.live_count() + router.pending == 1


class HangingAgent(nodeagent_pb2_grpc.NodeAgentServicer):
    """Starts every instance it is asked for and answers only after the
    caller's deadline (a sandbox start goes on regardless); records deletes."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def CreateInstance(
        self, request: nodeagent_pb2.CreateInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.CreateInstanceReply:
        await asyncio.Event().wait()  # answered after the deadline: never, here
        raise AssertionError("unreachable")

    async def DeleteInstance(
        self, request: nodeagent_pb2.DeleteInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.DeleteInstanceReply:
        self.deleted.append(request.instance_id)
        return nodeagent_pb2.DeleteInstanceReply(deleted=True)


def hold_one_credit(p: peers.Peers, agent: str) -> CreditWallet:
    """Give ``p`` one credit from Schedule "s0" on node "n0" of the agent at
    ``agent`` (and have it ask for no more); returns its wallet."""
    wallet = CreditWallet(target=1)
    req = wallet.begin_sync("s0")
    wallet.end_sync(req, [CreditGrant("c1", "n0", agent, Res(1000, 1024), 60.0)])
    p.credits = wallet
    p._no_credits.add("s0")  # (no refill exchange: no Schedule here)
    return wallet


@pytest.mark.slow
async def test_a_credit_start_past_its_deadline_is_stopped_on_its_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Retried through Schedule, the same id may land on another node: the
    # start left going on this one must be stopped first.
    monkeypatch.setattr(peers, "SCHEDULE_SLACK_S", 0.3)  # the CreateInstance deadline
    agent = HangingAgent()
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, "x")]
    )
    await server.start()
    pool = rpc.ChannelPool()
    p = peers.Peers("d0", pool)
    hold_one_credit(p, f"127.0.0.1:{port}")
    spec = common_pb2.FunctionSpec(
        name="f",
        startup_timeout_ms=1,
        resources=common_pb2.Resources(cpu_millis=100, memory_mib=64),
    )
    s0 = common_pb2.ControlInstance(id="s0", kind=common_pb2.CONTROL_KIND_SCHEDULE)
    try:
        with pytest.raises(Unavailable):
            await p.from_credit(spec, "f-d0-0", [s0])
        assert agent.deleted == ["f-d0-0"]
    finally:
        await p.close()
        await pool.close()
        await server.stop(None)
