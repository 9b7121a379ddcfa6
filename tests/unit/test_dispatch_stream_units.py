"""The two ends of DispatchStream without a network: a granted slot whose
answer never left is given back (server), and a grant that arrives after its
caller gave up is handed to the release callback (client)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from controlplane.runtime.validation import MAX_MESSAGE_BYTES
from controlplane.sdk.streams import _Stream
from functions.dispatch import stream as server
from galaxy.v1 import dispatch_pb2


class _Ctx:
    """The stream's own context, as much as serve() reads of it."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.initial_metadata: tuple[tuple[str, str], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, md: tuple[tuple[str, str], ...]) -> None:
        self.initial_metadata = md

    def peer(self) -> str:
        return "ipv4:10.0.0.9:1234"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"unexpected abort {code} {details}")


class _Servicer:
    """Grants at once and records how each answer ended (cancelled or not)."""

    def __init__(self, batches: bool = True) -> None:
        self.ended: dict[str, bool] = {}
        self.pool = SimpleNamespace(
            config=SimpleNamespace(stream_batches=batches, max_message_bytes=MAX_MESSAGE_BYTES)
        )
        # The stream reaches the channel config and releases through the
        # servicer's Dispatcher: here, this stand-in itself.
        self.dispatcher = self
        #: When set, each request waits for it; `held` is set once `expect`
        #: requests wait, `all_ended` once `expect` answers ended.
        self.gate: asyncio.Event | None = None
        self.expect = 0
        self.waiting = 0
        self.held = asyncio.Event()
        self.all_ended = asyncio.Event()

    def _end(self, rid: str, cancelled: bool) -> None:
        self.ended[rid] = cancelled
        if len(self.ended) == self.expect:
            self.all_ended.set()

    async def Dispatch(self, request: Any, ctx: server.MessageContext) -> Any:
        rid = request.request_id
        if self.gate is not None:
            self.waiting += 1
            if self.waiting == self.expect:
                self.held.set()
            await self.gate.wait()
        ctx.add_done_callback(lambda c: self._end(rid, c.cancelled()))
        return dispatch_pb2.InstanceAddr(function=request.function, lease_id=f"lease-{rid}")


def _msg(seq: int) -> dispatch_pb2.DispatchStreamRequest:
    return dispatch_pb2.DispatchStreamRequest(
        seq=seq, request=dispatch_pb2.DispatchRequest(function="f", request_id=f"r{seq}")
    )


async def test_answers_not_written_when_the_stream_breaks_are_given_back() -> None:
    svc = _Servicer()
    hold = asyncio.Event()

    async def requests() -> Any:
        for seq in (1, 2, 3):
            yield _msg(seq)
        await hold.wait()  # the caller keeps the stream open

    gen = server.serve(svc, requests(), _Ctx())  # type: ignore[arg-type]
    first = await gen.__anext__()
    second = await gen.__anext__()  # resuming confirms the first was written
    assert (first.seq, second.seq) == (1, 2) and first.addr.lease_id == "lease-r1"
    assert svc.ended == {"r1": False}
    await gen.aclose()  # the stream breaks: r2 was in hand, r3 still queued
    assert svc.ended == {"r1": False, "r2": True, "r3": True}


class _FakeCall:
    def __init__(self, requests: Any, metadata: Any = ()) -> None:
        self.metadata = metadata
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.sent: asyncio.Queue[dispatch_pb2.DispatchStreamRequest] = asyncio.Queue()
        self._pump = asyncio.get_running_loop().create_task(self._consume(requests))

    async def _consume(self, requests: Any) -> None:
        async for m in requests:
            self.sent.put_nowait(m)

    async def initial_metadata(self) -> Any:
        return self.metadata

    def __aiter__(self) -> _FakeCall:
        return self

    async def __anext__(self) -> Any:
        r = await self.replies.get()
        if r is None:
            raise StopAsyncIteration
        if isinstance(r, Exception):
            raise r
        return r

    def cancel(self) -> None:
        # As grpc.aio: reading a call cancelled here raises CANCELLED.
        self.replies.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, None, None))


class _FakeStub:
    def __init__(self, server_metadata: Any = ()) -> None:
        self.call: _FakeCall | None = None
        self.server_metadata = server_metadata
        self.metadata: Any = None

    def DispatchStream(self, requests: Any, timeout: float, metadata: Any) -> _FakeCall:
        self.metadata = metadata
        self.call = _FakeCall(requests, self.server_metadata)
        return self.call


async def test_a_request_that_times_out_is_withdrawn_and_its_late_grant_released() -> None:
    stub, orphans = _FakeStub(), []
    s = _Stream(stub, None, orphans.append, lambda _s: None)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.request(dispatch_pb2.DispatchRequest(function="f"), 0.05)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    call = stub.call
    assert call is not None
    sent, withdrawn = await _next(call), await _next(call)
    assert sent.seq == 1 and sent.timeout_ms == 50 and not sent.cancel
    assert withdrawn.seq == 1 and withdrawn.cancel
    late = dispatch_pb2.InstanceAddr(function="f", lease_id="late")
    call.replies.put_nowait(dispatch_pb2.DispatchStreamReply(seq=1, addr=late))
    # An answer for a request still waited for goes to its caller instead.
    waiting = asyncio.create_task(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
    assert (await _next(call)).seq == 2
    call.replies.put_nowait(dispatch_pb2.DispatchStreamReply(seq=2, addr=late))
    assert (await waiting).addr.lease_id == "late"
    assert [a.lease_id for a in orphans] == ["late"]
    s.cancel()
    await asyncio.wait_for(s._reader, 5)
    assert not s.accepting


async def _next(call: _FakeCall) -> dispatch_pb2.DispatchStreamRequest:
    return await asyncio.wait_for(call.sent.get(), 5)


async def test_a_stream_cut_off_by_a_dead_peer_fails_its_requests_unavailable() -> None:
    """grpc.aio ends such a stream INTERNAL ("Internal error from Core");
    a unary call would have said UNAVAILABLE, which the SDK retries."""
    stub = _FakeStub()
    s = _Stream(stub, None, lambda a: None, lambda _s: None)
    waiting = asyncio.create_task(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
    assert stub.call is not None
    await _next(stub.call)
    stub.call.replies.put_nowait(
        grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, details="Internal error from Core")
    )
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await waiting
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "INTERNAL: Internal error from Core" in e.value.details()
    assert not s.accepting


async def test_a_stream_a_stopping_server_cancels_fails_its_requests_unavailable() -> None:
    """A Dispatch whose stop grace runs out cancels its streams: the
    requests still out are retried elsewhere (UNAVAILABLE), not failed
    CANCELLED (the SDK retries no CANCELLED); a stream this side cancels
    fails them CANCELLED."""
    for ours in (False, True):
        stub = _FakeStub()
        s = _Stream(stub, None, lambda a: None, lambda _s: None)
        waiting = asyncio.create_task(s.request(dispatch_pb2.DispatchRequest(function="f"), 5.0))
        assert stub.call is not None
        await _next(stub.call)
        if ours:
            s.cancel()
        else:  # the server's end
            stub.call.replies.put_nowait(
                grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, None, None)
            )
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await waiting
        want = grpc.StatusCode.CANCELLED if ours else grpc.StatusCode.UNAVAILABLE
        assert e.value.code() == want


async def test_a_caller_that_never_reads_is_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replies not yet written stay bounded: the reader stops taking
    messages while MAX_IN_FLIGHT of them wait (HTTP/2 flow control then
    holds the caller back)."""
    monkeypatch.setattr(server, "MAX_IN_FLIGHT", 4)
    pulled = 0

    async def requests() -> Any:
        nonlocal pulled
        for seq in range(1, 21):
            pulled += 1
            yield dispatch_pb2.DispatchStreamRequest(seq=seq)  # no request: an error reply

    gen = server.serve(_Servicer(), requests(), _Ctx())  # type: ignore[arg-type]
    first = await gen.__anext__()
    assert first.message == "request: required"
    for _ in range(200):  # ample turns for an unbounded reader to take all 20
        await asyncio.sleep(0)
    assert pulled <= 4 + 2
    rest = [r async for r in gen]  # reading on lets it take the rest
    assert pulled == 20 and len(rest) == 19
