"""Batches on the multiplexed streams (controlplane.runtime.multiplex),
without a network: what queued while a write was out goes as one message,
only between sides that said they read batches, in order, never waiting to
fill one; a malformed batch ends the stream naming the field."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest

from controlplane.runtime import batches
from controlplane.sdk.streams import _Stream
from functions.dispatch import stream as server
from galaxy.v1 import dispatch_pb2
from tests.unit.test_dispatch_stream_units import _Ctx, _FakeStub, _msg, _next, _Servicer

ASKS = (batches.BATCH_ON,)


async def _three_ready(svc: _Servicer, ctx: _Ctx) -> tuple[Any, list[Any]]:
    """Serve requests 1-3, all answered before the reply loop resumes; the
    first reply written, and the generator."""
    svc.gate, svc.expect = asyncio.Event(), 3
    hold = asyncio.Event()

    async def requests() -> Any:
        for seq in (1, 2, 3):
            yield _msg(seq)
        await hold.wait()

    gen = server.serve(svc, requests(), ctx)  # type: ignore[arg-type]
    first = asyncio.ensure_future(gen.__anext__())
    await svc.held.wait()
    svc.gate.set()
    return gen, [await first]


async def test_replies_ready_together_go_as_one_batch_to_a_caller_that_reads_them() -> None:
    svc, ctx = _Servicer(), _Ctx(ASKS)
    gen, (reply,) = await _three_ready(svc, ctx)
    assert ctx.initial_metadata == ASKS  # the server says it reads batches too
    assert [r.seq for r in batches.items(reply)] == [1, 2, 3]
    assert [r.addr.lease_id for r in reply.more] == ["lease-r2", "lease-r3"]
    assert svc.ended == {}  # written once the loop resumes
    await gen.aclose()
    # Resumed by the close, not by a written batch: all three given back.
    assert svc.ended == {"r1": True, "r2": True, "r3": True}


async def test_a_written_batch_confirms_every_reply_in_it() -> None:
    svc, ctx = _Servicer(), _Ctx(ASKS)
    gen, _ = await _three_ready(svc, ctx)
    waiter = asyncio.ensure_future(gen.__anext__())  # resuming = the batch was written
    await svc.all_ended.wait()
    assert svc.ended == {"r1": False, "r2": False, "r3": False}
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    await gen.aclose()


@pytest.mark.parametrize(("asks", "batches"), [((), True), (ASKS, False)])
async def test_no_batches_unless_both_sides_take_them(asks: Any, batches: bool) -> None:
    svc, ctx = _Servicer(batches=batches), _Ctx(asks)
    gen, (first,) = await _three_ready(svc, ctx)
    rest = [await gen.__anext__(), await gen.__anext__()]
    assert [r.seq for r in [first, *rest]] == [1, 2, 3]
    assert not any(r.more for r in [first, *rest])
    assert ctx.initial_metadata == (ASKS if batches else None)
    await gen.aclose()


@pytest.mark.parametrize(
    ("more", "problem"),
    [
        ([_msg(s) for s in range(2, 2 + batches.MAX_BATCH)], "more: at most 255 messages"),
        ([dispatch_pb2.DispatchStreamRequest(seq=2, more=[_msg(3)])], "more[0].more: must be"),
    ],
)
async def test_a_malformed_batch_ends_the_stream_naming_the_field(
    more: list[Any], problem: str
) -> None:
    aborted: list[tuple[grpc.StatusCode, str]] = []

    class Ctx(_Ctx):
        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            aborted.append((code, details))

    async def requests() -> Any:
        m = _msg(1)
        m.more.extend(more)
        yield m

    svc = _Servicer()
    replies = [r async for r in server.serve(svc, requests(), Ctx(ASKS))]  # type: ignore[arg-type]
    assert replies == [] and svc.ended == {}  # nothing of it was served
    ((code, details),) = aborted
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(problem)
    assert len(details) < 100  # the message names the field, it does not echo the batch


async def test_a_batch_is_served_as_its_messages_in_order() -> None:
    async def requests() -> Any:
        m = _msg(1)
        m.more.extend([_msg(2), dispatch_pb2.DispatchStreamRequest(seq=3)])
        yield m

    svc = _Servicer()
    replies = [r async for r in server.serve(svc, requests(), _Ctx())]  # type: ignore[arg-type]
    got = {r.seq: r for reply in replies for r in batches.items(reply)}
    assert sorted(got) == [1, 2, 3]
    assert got[2].addr.lease_id == "lease-r2"
    assert got[3].message == "request: required"  # each checked on its own


async def test_the_client_batches_what_queued_once_the_server_reads_batches() -> None:
    stub = _FakeStub(server_metadata=ASKS)
    s = _Stream(stub, (("authorization", "Bearer t"),), lambda a: None, lambda _s: None)
    assert stub.metadata == (("authorization", "Bearer t"), batches.BATCH_ON)
    assert stub.call is not None
    await s.learn_batching(stub.call)  # what the reader does first
    assert s.batch_ok
    calls = [
        asyncio.ensure_future(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
        for _ in range(4)
    ]
    first = await _next(stub.call)
    # Nothing waits to fill a batch: the first went alone, the rest queued
    # behind its write and went together.
    sent = [first] if first.more else [first, await _next(stub.call)]
    seqs = [r.seq for m in sent for r in batches.items(m)]
    assert seqs == [1, 2, 3, 4] and len(sent) <= 2 and sent[-1].more
    reply = dispatch_pb2.DispatchStreamReply(seq=4, addr=dispatch_pb2.InstanceAddr(lease_id="d"))
    reply.more.extend(
        dispatch_pb2.DispatchStreamReply(seq=q, addr=dispatch_pb2.InstanceAddr(lease_id=f"l{q}"))
        for q in (1, 2, 3)
    )
    stub.call.replies.put_nowait(reply)
    got = [r.addr.lease_id for r in await asyncio.gather(*calls)]
    assert got == ["l1", "l2", "l3", "d"]
    s.cancel()


async def test_the_client_sends_one_message_per_write_to_a_server_without_batches() -> None:
    stub = _FakeStub(server_metadata=())
    s = _Stream(stub, None, lambda a: None, lambda _s: None)
    assert stub.call is not None
    await s.learn_batching(stub.call)
    assert not s.batch_ok
    calls = [
        asyncio.ensure_future(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
        for _ in range(3)
    ]
    sent = [await _next(stub.call) for _ in range(3)]
    assert [m.seq for m in sent] == [1, 2, 3] and not any(m.more for m in sent)
    for c in calls:
        c.cancel()
    s.cancel()


def test_a_batch_stays_under_half_the_message_size_limit() -> None:
    assert batches.batch_bytes(64 * 1024 * 1024) == batches.MAX_BATCH_BYTES
    assert batches.batch_bytes(1024) == 512


async def test_replies_over_the_byte_bound_go_in_the_next_write_in_order() -> None:
    one = dispatch_pb2.DispatchStreamReply(
        seq=1, addr=dispatch_pb2.InstanceAddr(function="f", lease_id="lease-r1")
    ).ByteSize()
    svc, ctx = _Servicer(), _Ctx(ASKS)
    svc.pool.config.max_message_bytes = 2 * (2 * one + 1)  # a bound of two replies
    gen, (first,) = await _three_ready(svc, ctx)
    written = [first]
    while sum(len(batches.items(m)) for m in written) < 3:
        written.append(await gen.__anext__())
    assert [r.seq for m in written for r in batches.items(m)] == [1, 2, 3]
    assert [len(batches.items(m)) for m in written] == [2, 1]  # not all three at once
    await gen.aclose()


async def test_the_client_keeps_a_batch_under_its_byte_bound() -> None:
    stub = _FakeStub(server_metadata=ASKS)
    s = _Stream(stub, None, lambda a: None, lambda _s: None)
    assert stub.call is not None
    await s.learn_batching(stub.call)
    one = dispatch_pb2.DispatchStreamRequest(
        seq=1, request=dispatch_pb2.DispatchRequest(function="f"), timeout_ms=5000
    ).ByteSize()
    s.max_batch_bytes = 2 * one + 1  # two requests at most
    calls = [
        asyncio.ensure_future(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
        for _ in range(6)
    ]
    sent: list[Any] = []
    while sum(len(batches.items(m)) for m in sent) < 6:
        sent.append(await _next(stub.call))
    assert [r.seq for m in sent for r in batches.items(m)] == [1, 2, 3, 4, 5, 6]
    assert len(sent) >= 3 and all(len(batches.items(m)) <= 2 for m in sent)
    for c in calls:
        c.cancel()
    s.cancel()


async def test_a_reply_held_for_the_next_write_is_given_back_when_the_stream_breaks() -> None:
    """A reply taken off the queue while filling a batch but too big to join
    it waits for the next write; if the stream breaks first, its slot is
    given back like every other answer that never left."""
    one = dispatch_pb2.DispatchStreamReply(
        seq=1, addr=dispatch_pb2.InstanceAddr(function="f", lease_id="lease-r1")
    ).ByteSize()
    svc, ctx = _Servicer(), _Ctx(ASKS)
    svc.pool.config.max_message_bytes = 2 * (2 * one + 1)  # a bound of two replies
    gen, (first,) = await _three_ready(svc, ctx)
    assert len(batches.items(first)) == 2  # r3 is held for the next write
    await gen.aclose()  # the stream breaks before that write
    assert svc.ended == {"r1": True, "r2": True, "r3": True}
