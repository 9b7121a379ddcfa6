"""DispatchStream: many Dispatch requests over one long-lived gRPC stream.

A unary call costs grpc.aio a new HTTP/2 stream, its metadata and a call
object on both sides; a message on an open stream costs about half of that
in Dispatch's CPU (docs/benchmarks.md). A busy caller (the SDK, the gateway)
therefore keeps one stream per Dispatch instance and sends each request as a
message. Every message is served by the same code as the unary ``Dispatch``
(``DispatchServicer.Dispatch``) with a ``MessageContext`` standing in for the
call's context: its own deadline, and a "cancelled" state that releases a
granted slot whose answer never left (the stream broke, or the caller
withdrew the request) exactly as a unary call's cancellation does.

Answers go out as they are ready, each tagged with the request's ``seq``.
Every stream is bounded: at most ``MAX_IN_FLIGHT`` requests in flight, a
goaway after ``MAX_AGE_S`` (so a token revoked in the meantime stops being
honoured once the caller reopens), and an end at ``HARD_LIMIT_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Gauge

from controlplane.runtime import validation
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.metrics import RPC_LATENCY, RPC_REQUESTS
from controlplane.runtime.rpc import Undecodable
from galaxy.v1 import dispatch_pb2

if TYPE_CHECKING:
    from functions.dispatch.service import DispatchServicer

log = logging.getLogger(__name__)

METHOD = "Dispatch/DispatchStream"
#: Requests one stream may have in flight; one more is refused
#: RESOURCE_EXHAUSTED (the caller then opens another stream or calls unary).
MAX_IN_FLIGHT = 1024
#: After this long the caller is asked to move to a new stream.
MAX_AGE_S = 30.0
#: A request's wait when the message names none (as a unary call without a
#: deadline), and the longest it may name.
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_MS = 600_000
#: The stream ends here at the latest; what is still in flight is withdrawn.
#: Long enough for a request sent just before the goaway to finish.
HARD_LIMIT_S = MAX_AGE_S + DEFAULT_TIMEOUT_S + 5.0

STREAMS_OPEN = Gauge("galaxy_dispatch_streams_open", "DispatchStream calls open on this instance")
_LATENCY = RPC_LATENCY.labels(METHOD)


class _Aborted(Exception):
    """MessageContext.abort: ends one message, not the stream."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class MessageContext:
    """The parts of a ``grpc.aio.ServicerContext`` that ``Dispatch`` uses,
    for one message of a stream: the message's own deadline, abort (which
    fails this message only), the stream's metadata, and done
    callbacks run once the answer was sent (``cancelled()`` False) or can no
    longer be (True)."""

    __slots__ = ("_callbacks", "_cancelled", "_deadline", "_loop", "_stream")

    def __init__(
        self, stream: grpc.aio.ServicerContext, deadline: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._stream = stream
        self._deadline = deadline
        self._loop = loop
        self._callbacks: list[Callable[[Any], None]] = []
        self._cancelled = False

    def time_remaining(self) -> float:
        """Seconds until this message's deadline."""
        return max(0.0, self._deadline - self._loop.time())

    def invocation_metadata(self) -> Any:
        """The stream's metadata (the caller's token)."""
        return self._stream.invocation_metadata()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """callback(self) once the message's answer was sent or given up."""
        self._callbacks.append(callback)

    def cancelled(self) -> bool:
        """True when the answer never reached the caller."""
        return self._cancelled

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """Fail this message with code (the stream stays open)."""
        raise _Aborted(code, details)

    def finish(self, cancelled: bool) -> None:
        """Run the done callbacks (once)."""
        self._cancelled = cancelled
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # one callback must not keep the others from running
                log.exception("a DispatchStream done callback failed")


def _error(seq: int, code: grpc.StatusCode, message: str) -> dispatch_pb2.DispatchStreamReply:
    return dispatch_pb2.DispatchStreamReply(seq=seq, code=code.value[0], message=message)


class _Fatal:
    """Ends the stream with code: the caller broke the stream's protocol."""

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


_GOAWAY = dispatch_pb2.DispatchStreamReply(seq=0, goaway=True)
_Item = tuple[dispatch_pb2.DispatchStreamReply, MessageContext | None] | _Fatal | None


class _Stream:
    """The state of one open stream (see module docstring)."""

    def __init__(self, servicer: DispatchServicer, context: grpc.aio.ServicerContext) -> None:
        self.servicer = servicer
        self.context = context
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[_Item] = asyncio.Queue()
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.reading = True
        # Set while the replies not yet written are few enough to read on:
        # a caller that sends and never reads is held back here (and by
        # HTTP/2 flow control behind it), so `out` stays bounded.
        self.drained = asyncio.Event()
        self.drained.set()

    def _done_if_idle(self) -> None:
        if not self.reading and not self.calls:
            self.out.put_nowait(None)

    async def read(self, requests: AsyncIterator[Any]) -> None:
        """Start a task per request; withdraw on cancel; stop on a broken protocol."""
        try:
            async for msg in requests:
                if self.out.qsize() >= MAX_IN_FLIGHT:
                    self.drained.clear()
                    await self.drained.wait()
                if isinstance(msg, Undecodable):
                    self.out.put_nowait(
                        _Fatal(grpc.StatusCode.INVALID_ARGUMENT, f"request: {msg.reason}")
                    )
                    return
                seq = msg.seq
                if msg.releases:
                    try:
                        validation.check_releases(msg.releases, required=True)
                    except GalaxyError as e:
                        self.out.put_nowait(_Fatal(e.code, e.message))
                        return
                    self.servicer.release_many(msg.releases)
                    if not seq:
                        continue  # releases only
                if msg.cancel:
                    task = self.calls.pop(seq, None)
                    if task is not None:
                        task.cancel()
                    continue
                if seq <= 0:
                    self.out.put_nowait(
                        _Fatal(grpc.StatusCode.INVALID_ARGUMENT, "seq: must be > 0")
                    )
                    return
                if seq in self.calls:
                    self.out.put_nowait(
                        _Fatal(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"seq: {seq} is already in flight on this stream",
                        )
                    )
                    return
                problem = _check(msg)
                if problem is not None:
                    self.out.put_nowait(
                        (_error(seq, grpc.StatusCode.INVALID_ARGUMENT, problem), None)
                    )
                    continue
                if len(self.calls) >= MAX_IN_FLIGHT:
                    self.out.put_nowait(
                        (
                            _error(
                                seq,
                                grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"stream: {MAX_IN_FLIGHT} requests already in flight; "
                                "open another stream",
                            ),
                            None,
                        )
                    )
                    continue
                timeout = msg.timeout_ms / 1000.0 if msg.timeout_ms else DEFAULT_TIMEOUT_S
                mctx = MessageContext(self.context, self.loop.time() + timeout, self.loop)
                self.calls[seq] = self.loop.create_task(self.serve(seq, msg.request, mctx))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            # The caller went away mid-stream: what it sent is withdrawn.
            log.debug("DispatchStream from %s ended: %s", self.context.peer(), e)
        finally:
            self.reading = False
            self._done_if_idle()

    async def serve(
        self, seq: int, request: dispatch_pb2.DispatchRequest, mctx: MessageContext
    ) -> None:
        """One request, through the unary handler's code."""
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            try:
                async with asyncio.timeout(mctx.time_remaining()):
                    addr = await self.servicer.Dispatch(request, mctx)  # type: ignore[arg-type]
                reply = dispatch_pb2.DispatchStreamReply(seq=seq, addr=addr)
            except GalaxyError as e:
                code = e.code
                reply = _error(seq, e.code, e.message)
            except _Aborted as e:
                code = e.code
                reply = _error(seq, e.code, e.details)
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                reply = _error(seq, code, "dispatch: the request's timeout_ms ran out")
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                mctx.finish(cancelled=True)
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", METHOD)
                reply = _error(seq, code, f"internal error in {METHOD}; see the server log")
        finally:
            _LATENCY.observe(time.perf_counter() - start)
            RPC_REQUESTS.labels(METHOD, code.name).inc()
            if self.calls.get(seq) is asyncio.current_task():
                del self.calls[seq]
            if code is grpc.StatusCode.CANCELLED:
                self._done_if_idle()
        self.out.put_nowait((reply, mctx))
        self._done_if_idle()

    def close(self) -> None:
        """Withdraw what is in flight and give up answers not sent."""
        for task in self.calls.values():
            task.cancel()
        self.calls.clear()
        while not self.out.empty():
            item = self.out.get_nowait()
            if isinstance(item, tuple) and item[1] is not None:
                item[1].finish(cancelled=True)


def _check(msg: dispatch_pb2.DispatchStreamRequest) -> str | None:
    """What is wrong with one message, naming the field (None: nothing)."""
    if not msg.HasField("request"):
        return "request: required"
    if msg.timeout_ms > MAX_TIMEOUT_MS:
        return f"timeout_ms: at most {MAX_TIMEOUT_MS}, got {msg.timeout_ms}"
    return None


async def serve(
    servicer: DispatchServicer,
    requests: AsyncIterator[dispatch_pb2.DispatchStreamRequest],
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[dispatch_pb2.DispatchStreamReply]:
    """The DispatchStream handler (``DispatchServicer.DispatchStream``)."""
    stream = _Stream(servicer, context)
    loop = stream.loop
    reader = loop.create_task(stream.read(requests))
    # Timers, not a timeout per wait: a reply costs one queue get, no timer.
    goaway = loop.call_later(MAX_AGE_S, stream.out.put_nowait, _GOAWAY_ITEM)
    hard_end = loop.call_later(HARD_LIMIT_S, stream.out.put_nowait, None)
    STREAMS_OPEN.inc()
    sending: MessageContext | None = None
    try:
        while True:
            item = await stream.out.get()
            if stream.out.qsize() < MAX_IN_FLIGHT:
                stream.drained.set()
            if item is None:
                return
            if isinstance(item, _Fatal):
                await context.abort(item.code, item.message)
                return
            reply, sending = item
            yield reply
            # gRPC resumes the handler once the reply is written; if the
            # stream broke, it closes the handler here instead.
            if sending is not None:
                sending.finish(cancelled=False)
                sending = None
    finally:
        if sending is not None:
            sending.finish(cancelled=True)
        goaway.cancel()
        hard_end.cancel()
        reader.cancel()
        stream.close()
        STREAMS_OPEN.dec()


_GOAWAY_ITEM: _Item = (_GOAWAY, None)
