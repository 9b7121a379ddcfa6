"""The asyncio ``Outbox`` performing ``OutboxQueue``'s decisions over real
gRPC on loopback: a failed ModNodes call is retried after a backoff (with
what arrived meanwhile), a message is given up after ``tries`` sends, and
an UPSERT that replaced an unsent REMOVE goes as REMOVE + UPSERT."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.runtime.rpc import ChannelPool, create_server
from functions.clustermgr.outbox import REMOVE, UPSERT, Outbox
from functions.schedule.service import SERVICE_NAME as SF_SERVICE
from galaxy.v1 import common_pb2, schedule_pb2, schedule_pb2_grpc


class FlakySchedule(schedule_pb2_grpc.ScheduleServicer):
    """Records each ModNodes call's changes; the first ``fail`` calls fail."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls: list[list[tuple[int, str]]] = []

    async def ModNodes(
        self, request: schedule_pb2.ModNodesRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ModNodesReply:
        self.calls.append([(c.op, c.node.node_id) for c in request.changes])
        if len(self.calls) <= self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not now")
        return schedule_pb2.ModNodesReply()


async def _serve(sched: FlakySchedule) -> AsyncIterator[tuple[Outbox, str]]:
    server, port, _ = create_server(
        "127.0.0.1:0", [(schedule_pb2_grpc.add_ScheduleServicer_to_server, sched, SF_SERVICE)]
    )
    await server.start()
    pool = ChannelPool()
    outbox = Outbox(pool, tries=3, backoff_s=0.01)
    try:
        yield outbox, f"127.0.0.1:{port}"
    finally:
        await outbox.close()
        await pool.close()
        await server.stop(None)


def _req(op: int, nid: str) -> schedule_pb2.ModNodeRequest:
    return schedule_pb2.ModNodeRequest(op=op, node=common_pb2.NodeStatus(node_id=nid))


@pytest.fixture
async def flaky_once() -> AsyncIterator[tuple[Outbox, str, FlakySchedule]]:
    sched = FlakySchedule(fail=1)
    async for outbox, addr in _serve(sched):
        yield outbox, addr, sched


async def test_a_failed_call_is_retried_with_a_reset_kept(
    flaky_once: tuple[Outbox, str, FlakySchedule],
) -> None:
    outbox, addr, sched = flaky_once
    outbox.put(addr, _req(REMOVE, "n1"))
    outbox.put(addr, _req(UPSERT, "n1"))  # a restarted node: forget, then learn
    outbox.put(addr, _req(UPSERT, "n2"))
    await outbox.flush()
    reset = [(REMOVE, "n1"), (UPSERT, "n1"), (UPSERT, "n2")]
    assert sched.calls == [reset, reset]
    assert (outbox.calls, outbox.sent, outbox.failed) == (2, 2, 0)


async def test_a_message_is_given_up_after_its_tries() -> None:
    sched = FlakySchedule(fail=10)
    async for outbox, addr in _serve(sched):
        outbox.put(addr, _req(UPSERT, "n1"), wait_s=0.01)
        await outbox.flush()
        assert sched.calls == [[(UPSERT, "n1")]] * 3
        assert (outbox.calls, outbox.sent, outbox.failed) == (3, 0, 1)
