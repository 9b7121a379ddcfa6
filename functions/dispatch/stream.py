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
goaway after ``MAX_AGE_S``, and an end at ``HARD_LIMIT_S``. Each request
re-checks the stream's token (``authn.recheck``): a revoked token is refused
within the token cache's TTL, as on a unary call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Gauge

from controlplane.runtime import authn, multiplex, validation
from controlplane.runtime.batches import batch_bytes
from controlplane.runtime.errors import GalaxyError
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
multiplex.timed(METHOD)


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
        raise multiplex.Aborted(code, details)

    def finish(self, cancelled: bool) -> None:
        """Run the done callbacks (once)."""
        self._cancelled = cancelled
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # one callback must not keep the others from running
                log.exception("a DispatchStream done callback failed")


class _Stream(multiplex.ServerStream[dispatch_pb2.DispatchStreamReply]):
    """The state of one open stream (see module docstring)."""

    name = "DispatchStream"
    log = log

    def __init__(self, servicer: DispatchServicer, context: grpc.aio.ServicerContext) -> None:
        config = servicer.dispatcher.pool.config
        super().__init__(
            context, dispatch_pb2.DispatchStreamReply, MAX_IN_FLIGHT, config.stream_batches
        )
        self.max_batch_bytes = batch_bytes(config.max_message_bytes)
        self.servicer = servicer

    def accept(self, msg: Any) -> multiplex.Fatal | None:
        """Start a task per request; withdraw on cancel; stop on a broken protocol."""
        fatal = self.undecodable(msg)
        if fatal is not None:
            return fatal
        seq = msg.seq
        if msg.releases:
            try:
                validation.check_releases(msg.releases, required=True)
            except GalaxyError as e:
                return multiplex.Fatal(e.code, e.message)
            self.servicer.dispatcher.release_many(msg.releases)
            if not seq:
                return None  # releases only
        if msg.cancel:
            task = self.calls.pop(seq, None)
            if task is not None:
                task.cancel()
            return None
        fatal = self.check_new_seq(seq)
        if fatal is not None:
            return fatal
        if self.admit(seq, _check(msg), "open another stream"):
            timeout = msg.timeout_ms / 1000.0 if msg.timeout_ms else DEFAULT_TIMEOUT_S
            due = self.loop.time() + timeout
            mctx = MessageContext(self.context, due, self.loop)
            self.calls[seq] = self.loop.create_task(
                self.answer(seq, METHOD, msg.request, due, "dispatch", mctx)
            )
        return None

    async def call(
        self, seq: int, method: str, msg: Any, sent: multiplex.Sent | None
    ) -> dispatch_pb2.DispatchStreamReply:
        """One request, through the unary handler's code."""
        # The stream's token was checked when it opened; a revocation since
        # must stop it too (within the token cache's TTL).
        await authn.recheck()
        addr = await self.servicer.Dispatch(msg, sent)  # type: ignore[arg-type]
        return dispatch_pb2.DispatchStreamReply(seq=seq, addr=addr)


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
    """The DispatchStream handler (``DispatchServicer.DispatchStream``): an
    async generator function, as grpc.aio tells handler kinds apart by that."""
    stream = _Stream(servicer, context)
    # aclosing: when gRPC closes this handler, the stream's cleanup runs now.
    async with contextlib.aclosing(
        stream.replies(requests, MAX_AGE_S, HARD_LIMIT_S, STREAMS_OPEN)
    ) as replies:
        async for reply in replies:
            yield reply
