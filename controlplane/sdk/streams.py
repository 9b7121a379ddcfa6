"""The SDK's side of ``Dispatch.DispatchStream``: one stream per Dispatch
instance (and token), each request a message on it.

A message on an open stream costs both sides about half of a unary call's
CPU in grpc.aio (docs/benchmarks.md), which is most of what a warm request
costs. To the caller nothing changes: ``DispatchStreams.dispatch`` answers
an ``InstanceAddr`` or raises the ``grpc.aio.AioRpcError`` the unary call
would have raised (the same code and message), so retries and failover stay
where they are (``GalaxyClient.dispatch``).

Falls back to the unary call, per request, when streams are off (or the
connection cache is: the ablation opens a channel per call), when the
server does not know the method (an older Dispatch: remembered per
address; also when a new stream breaks before its first reply, which is
how a server whose servicer has only the generated stub ends it now and
then, INTERNAL rather than UNIMPLEMENTED: unary for ``RETRY_STREAM_S``,
then a stream is tried again), when a stream already has ``MAX_IN_FLIGHT`` requests out, or
when ``MAX_STREAMS`` streams are open for other (address, token) pairs.
A request that times out is withdrawn on the stream (``cancel``); an answer
that arrives for a request no one waits for any more is released.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc

from controlplane.runtime import batches, multiplex
from controlplane.runtime.multiplex import reply_error, rpc_error
from controlplane.runtime.rpc import ChannelPool
from galaxy.v1 import dispatch_pb2, dispatch_pb2_grpc

#: The server's bound on one stream's requests in flight.
MAX_IN_FLIGHT = 1024
#: Streams one client keeps open (one per Dispatch instance and token: a
#: gateway passes on each HTTP client's). Requests of further pairs go as
#: unary calls until a stream retires (its goaway comes after 30 s): opening
#: a stream per request would cost more than the unary call it replaces.
MAX_STREAMS = 64
#: The stream's own deadline: the server asks for a new stream after 30 s
#: and ends an old one by 95 s, so this is only a backstop.
STREAM_DEADLINE_S = 120.0

#: How long close() lets the streams finish what they carry.
CLOSE_WAIT_S = 2.0
#: After a stream to an address broke before any reply, that address gets
#: unary calls this long.
RETRY_STREAM_S = 30.0

#: How a stream ends that Dispatch did not end on purpose: a dead peer
#: (INTERNAL, UNKNOWN), or a server stopping, whose grace ran out on the
#: stream (CANCELLED, when this side did not cancel it).
_BROKEN = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED})
Metadata = tuple[tuple[str, str], ...] | None


class _Stream(
    multiplex.ClientStream[dispatch_pb2.DispatchStreamRequest, dispatch_pb2.DispatchStreamReply]
):
    """One open DispatchStream: requests in flight by seq."""

    name = "DispatchStream"

    def __init__(
        self,
        stub: Any,
        metadata: Metadata,
        on_orphan: Callable[[dispatch_pb2.InstanceAddr], None],
        on_closed: Callable[[_Stream], None],
    ) -> None:
        super().__init__()
        self._on_orphan = on_orphan
        self._on_closed = on_closed
        self._cancelled = False  # by this side (cancel)
        #: a reply came; broke_unanswered: the stream broke before one did
        self.answered = False
        self.broke_unanswered = False
        self.call = stub.DispatchStream(
            self.outgoing(),
            timeout=STREAM_DEADLINE_S,
            metadata=(*(metadata or ()), batches.BATCH_ON),
        )
        self._reader = self.loop.create_task(self._read())

    async def _read(self) -> None:
        err = rpc_error(grpc.StatusCode.UNAVAILABLE, "Dispatch ended the stream")
        try:
            await self.learn_batching(self.call)
            async for msg in self.call:
                self.answered = True
                for r in batches.items(msg):
                    if self.control(r.seq, r.goaway):
                        continue
                    fut = self.take(r.seq)
                    if fut is not None:
                        fut.set_result(r)
                    elif r.code == 0 and r.HasField("addr"):
                        self._on_orphan(r.addr)  # granted after its caller gave up
                    self._half_close_if_done()
        except grpc.aio.AioRpcError as e:
            err = e
            if e.code() in _BROKEN and not self._cancelled:
                self.broke_unanswered = not self.answered
                # A stream cut off by a dead peer ends INTERNAL ("Internal
                # error from Core") where a unary call says UNAVAILABLE;
                # Dispatch itself never ends a stream so (its errors travel
                # in replies). Unanswered requests are retried (request ids
                # make that safe), as after a unary call's UNAVAILABLE.
                err = rpc_error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the stream to Dispatch broke ({e.code().name}: {e.details()})",
                )
        except asyncio.CancelledError:
            err = rpc_error(grpc.StatusCode.CANCELLED, "the client closed the stream")
            raise
        finally:
            self.fail_pending(err)
            self._on_closed(self)

    def _withdraw(self, seq: int) -> None:
        if self.pending.pop(seq, None) is not None and not self._half_closed:
            self._out.put_nowait(dispatch_pb2.DispatchStreamRequest(seq=seq, cancel=True))
            self._half_close_if_done()

    def _expire(self, seq: int) -> None:
        fut = self.pending.get(seq)
        if fut is not None and not fut.done():
            fut.set_exception(
                rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded (DispatchStream)")
            )
        self._withdraw(seq)

    async def request(
        self, req: dispatch_pb2.DispatchRequest, timeout_s: float
    ) -> dispatch_pb2.DispatchStreamReply:
        """Send req; its reply, or the error that ended it."""
        seq, fut = self._new_call()
        self._out.put_nowait(
            dispatch_pb2.DispatchStreamRequest(
                seq=seq, request=req, timeout_ms=max(1, int(timeout_s * 1000))
            )
        )
        # A timer, not wait_for: no task per request.
        timer = self.loop.call_later(timeout_s, self._expire, seq)
        try:
            return await fut
        except asyncio.CancelledError:
            self._withdraw(seq)
            raise
        finally:
            timer.cancel()

    def release(self, rels: list[dispatch_pb2.ReleaseRequest]) -> bool:
        """Send rels as a message of their own (no reply); False if closed."""
        if self._half_closed:
            return False
        self._out.put_nowait(dispatch_pb2.DispatchStreamRequest(releases=rels))
        return True

    def cancel(self) -> None:
        """End the stream now (what is in flight fails CANCELLED)."""
        self._cancelled = True
        self.call.cancel()


class DispatchStreams:
    """Dispatch calls of one client, over streams where they can be (see
    module docstring). on_orphan(addr) releases a slot granted to a request
    that was already given up."""

    def __init__(
        self,
        pool: ChannelPool,
        on_orphan: Callable[[dispatch_pb2.InstanceAddr], None],
        enabled: bool = True,
    ) -> None:
        self.pool = pool
        self.enabled = enabled
        self._on_orphan = on_orphan
        self._streams: dict[tuple[str, Metadata], _Stream] = {}
        self._live: set[_Stream] = set()
        self._unary_only: set[str] = set()
        # Address -> loop time until which it gets unary calls (a stream
        # there broke before any reply).
        self._unary_until: dict[str, float] = {}
        # The newest stream to each address: where releases go.
        self._by_address: dict[str, _Stream] = {}
        #: Requests sent as stream messages and as unary calls.
        self.sent = {"stream": 0, "unary": 0}
        #: Streams opened (a goaway or a failure makes the next one).
        self.opened = 0

    async def dispatch(
        self,
        address: str,
        req: dispatch_pb2.DispatchRequest,
        timeout_s: float,
        metadata: Metadata,
    ) -> dispatch_pb2.InstanceAddr:
        """One Dispatch request to address; raises grpc.aio.AioRpcError."""
        if self.enabled and self.pool.enabled and self._streams_ok(address):
            stream = await self._stream(address, metadata)
            if stream is not None and len(stream.pending) < MAX_IN_FLIGHT:
                self.sent["stream"] += 1
                try:
                    r = await stream.request(req, timeout_s)
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._unary_only.add(address)  # an older Dispatch
                    elif stream.broke_unanswered:
                        # Streams may not work with this peer: the request
                        # goes unary now (its request id makes the retry
                        # safe), and the address for a while.
                        until = asyncio.get_running_loop().time() + RETRY_STREAM_S
                        self._unary_until[address] = until
                    else:
                        raise
                else:
                    if r.code:
                        raise reply_error(r.code, r.message)
                    return r.addr
        self.sent["unary"] += 1
        async with self.pool.stub(address, dispatch_pb2_grpc.DispatchStub) as s:
            return await s.Dispatch(req, timeout=timeout_s, metadata=metadata)  # type: ignore[no-any-return]

    def _streams_ok(self, address: str) -> bool:
        if address in self._unary_only:
            return False
        until = self._unary_until.get(address)
        if until is None:
            return True
        if asyncio.get_running_loop().time() < until:
            return False
        del self._unary_until[address]
        return True

    def release(self, address: str, rels: list[dispatch_pb2.ReleaseRequest]) -> bool:
        """Send rels on a stream open to address (any token's: a lease id is
        its own capability); False when there is none."""
        stream = self._by_address.get(address)
        return stream is not None and stream in self._live and stream.release(rels)

    async def _stream(self, address: str, metadata: Metadata) -> _Stream | None:
        """The open stream for (address, token), a new one, or None when
        MAX_STREAMS are open for other pairs (the request goes unary)."""
        key = (address, metadata)
        stream = self._streams.get(key)
        if stream is not None and stream.accepting:
            return stream
        if len(self._streams) >= MAX_STREAMS:
            for k in [k for k, s in self._streams.items() if not s.accepting]:
                del self._streams[k]
            if len(self._streams) >= MAX_STREAMS:
                return None
        async with self.pool.stub(address, dispatch_pb2_grpc.DispatchStub) as s:
            stream = _Stream(s, metadata, self._on_orphan, self._live.discard)
        stream.max_batch_bytes = batches.batch_bytes(self.pool.config.max_message_bytes)
        self._live.add(stream)
        self._by_address[address] = stream
        self.opened += 1
        self._streams[key] = stream
        return stream

    async def close(self) -> None:
        """End every stream once what was sent on it is answered (releases
        included), waiting at most CLOSE_WAIT_S; then cancel the rest."""
        streams = list(self._live)
        self._streams.clear()
        self._by_address.clear()
        for s in streams:
            s.accepting = False
            s._half_close()
        if streams:
            await asyncio.wait([s._reader for s in streams], timeout=CLOSE_WAIT_S)
        for s in streams:
            s.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await s._reader
