"""Unary calls multiplexed as messages on one bidirectional gRPC stream: the
mechanics both such protocols share (``Dispatch.DispatchStream``,
``NodeAgent.InstanceStream``).

Every request message carries a ``seq`` (> 0, unique among the stream's
calls in flight); the server serves each in a task of its own and answers
it as soon as it is done, tagged with that ``seq``; ``seq`` 0 is the
server's own (``goaway``: move to a new stream). A message that breaks the
protocol ends the stream INVALID_ARGUMENT naming the field.

``ServerStream`` is the server's state of one stream (the out queue, the
calls by seq, backpressure, the end once half-closed and idle) and its
reply loop; ``ClientStream`` the caller's (futures by seq, retiring after
a goaway, failing what was not answered when the stream ends). What the
messages hold, how one is served, and the metrics' names are each
protocol's own (``functions.dispatch.stream``,
``controlplane.nodeagent.instance_stream``, ``controlplane.sdk.streams``,
``controlplane.runtime.agent_streams``).

Batches: ``controlplane.runtime.batches``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Generic, Protocol, TypeVar

import grpc
from prometheus_client import Gauge

from controlplane.runtime.batches import (
    BATCH_ON,
    BATCHED,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    batching,
    items,
    problem,
)
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.metrics import RPC_LATENCY, RPC_REQUESTS
from controlplane.runtime.rpc import Undecodable

log = logging.getLogger(__name__)

Reply = TypeVar("Reply")
Request = TypeVar("Request")

#: RPC_LATENCY children by method label: labels() takes a lock per call.
_LATENCY: dict[str, Any] = {}


def timed(*methods: str) -> None:
    """Create the latency series of methods now (they show before the first
    message, as a series created at import does)."""
    for m in methods:
        _LATENCY[m] = RPC_LATENCY.labels(m)


def count(method: str, start: float, code: grpc.StatusCode) -> None:
    """Count and time one message under method (since perf_counter start),
    as the interceptor counts a unary call."""
    latency = _LATENCY.get(method)
    if latency is None:
        latency = _LATENCY[method] = RPC_LATENCY.labels(method)
    latency.observe(time.perf_counter() - start)
    RPC_REQUESTS.labels(method, code.name).inc()


class Aborted(Exception):
    """A message's context's abort: ends one message, not the stream."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Fatal:
    """Ends the stream with code: the caller broke the stream's protocol."""

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


class Sent(Protocol):
    """Told once a reply was written (``cancelled`` False) or never can be."""

    def finish(self, cancelled: bool) -> None: ...


#: What the reply loop takes from the out queue: a reply (with what to tell
#: once it was sent), a protocol error, or None (the end, OK).
Item = tuple[Any, Sent | None] | Fatal | None


class ServerStream(Generic[Reply]):
    """The server's state of one open stream. A subclass decides what one
    message is (``accept``: the helpers below check its framing) and serves
    each call in a task of its own in ``calls``, which ends with
    ``finished``."""

    #: The stream's name in log lines, the protocol module's logger, and
    #: its line for an error the handler did not expect (%s: the method).
    name = "stream"
    log = log
    unhandled = "unhandled error in %s"

    def __init__(
        self,
        context: grpc.aio.ServicerContext,
        reply_type: Any,
        max_in_flight: int,
        batches: bool = True,
    ) -> None:
        self.context = context
        self.reply_type = reply_type
        self.max_in_flight = max_in_flight
        #: Announce that batched requests are read, and batch the replies of a
        #: caller that reads them (off: one message per write both ways).
        self.batches = batches
        #: The byte bound of a batch of replies (``batches.batch_bytes``).
        self.max_batch_bytes = MAX_BATCH_BYTES
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[Item] = asyncio.Queue()
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.reading = True
        # Set while the replies not yet written are few enough to read on:
        # a caller that sends and never reads is held back here (and by
        # HTTP/2 flow control behind it), so `out` stays bounded.
        self.drained = asyncio.Event()
        self.drained.set()

    def error(self, seq: int, code: grpc.StatusCode, message: str) -> Reply:
        """The reply failing seq with code."""
        return self.reply_type(seq=seq, code=code.value[0], message=message)  # type: ignore[no-any-return]

    def _done_if_idle(self) -> None:
        if not self.reading and not self.calls:
            self.out.put_nowait(None)  # half-closed and all answered: end OK

    def accept(self, msg: Any) -> Fatal | None:
        """Take one message (start its call, or queue its answer); a Fatal
        ends the stream."""
        raise NotImplementedError

    async def read(self, requests: AsyncIterator[Any]) -> None:
        """Accept each message; stop on a broken protocol."""
        try:
            async for msg in requests:
                if self.out.qsize() >= self.max_in_flight:
                    self.drained.clear()
                    await self.drained.wait()
                batch: Any = (msg,)  # an Undecodable: accept ends the stream
                if not isinstance(msg, Undecodable):
                    bad = problem(msg)
                    if bad is not None:
                        self.out.put_nowait(Fatal(grpc.StatusCode.INVALID_ARGUMENT, bad))
                        return
                    batch = items(msg)
                for m in batch:
                    fatal = self.accept(m)
                    if fatal is not None:
                        self.out.put_nowait(fatal)
                        return
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            # The caller went away mid-stream: what it sent is withdrawn.
            self.log.debug("%s from %s ended: %s", self.name, self.context.peer(), e)
        finally:
            self.reading = False
            self._done_if_idle()

    def undecodable(self, msg: Any) -> Fatal | None:
        """The end of the stream when msg did not decode (None: it did)."""
        if isinstance(msg, Undecodable):
            return Fatal(grpc.StatusCode.INVALID_ARGUMENT, f"request: {msg.reason}")
        return None

    def check_new_seq(self, seq: int) -> Fatal | None:
        """The stream-ending problem with seq for a new call (None: none)."""
        if seq <= 0:
            return Fatal(grpc.StatusCode.INVALID_ARGUMENT, "seq: must be > 0")
        if seq in self.calls:
            return Fatal(
                grpc.StatusCode.INVALID_ARGUMENT, f"seq: {seq} is already in flight on this stream"
            )
        return None

    def admit(self, seq: int, problem: str | None, busy: str) -> bool:
        """Whether seq may start: else its answer is queued (INVALID_ARGUMENT
        for a problem with the message, RESOURCE_EXHAUSTED with the advice
        busy when the stream is full)."""
        if problem is not None:
            self.out.put_nowait((self.error(seq, grpc.StatusCode.INVALID_ARGUMENT, problem), None))
            return False
        if len(self.calls) >= self.max_in_flight:
            self.out.put_nowait(
                (
                    self.error(
                        seq,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"stream: {self.max_in_flight} requests already in flight; {busy}",
                    ),
                    None,
                )
            )
            return False
        return True

    async def call(self, seq: int, method: str, msg: Any, sent: Sent | None) -> Reply:
        """seq's reply from the unary handler's code (its errors raised)."""
        raise NotImplementedError

    async def answer(
        self,
        seq: int,
        method: str,
        msg: Any,
        deadline: float,
        timed_out: str,
        sent: Sent | None = None,
    ) -> None:
        """Serve seq (the task in ``calls``): ``call``'s reply by deadline
        (loop time), or the error it ended with, counted under method. A
        timeout is answered "<timed_out>: the request's timeout_ms ran out"."""
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        reply: Reply | None = None
        try:
            async with asyncio.timeout_at(deadline):
                reply = await self.call(seq, method, msg, sent)
        except GalaxyError as e:
            code = e.code
            reply = self.error(seq, e.code, e.message)
        except Aborted as e:
            code = e.code
            reply = self.error(seq, e.code, e.details)
        except TimeoutError:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            reply = self.error(seq, code, f"{timed_out}: the request's timeout_ms ran out")
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            if sent is not None:
                sent.finish(cancelled=True)
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            self.log.exception(self.unhandled, method)
            reply = self.error(seq, code, f"internal error in {method}; see the server log")
        finally:
            count(method, start, code)
            self.finished(seq, reply, sent)

    def finished(self, seq: int, reply: Reply | None, sent: Sent | None = None) -> None:
        """seq's call is over: queue its reply (None: withdrawn)."""
        if self.calls.get(seq) is asyncio.current_task():
            del self.calls[seq]
        if reply is not None:
            self.out.put_nowait((reply, sent))
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

    async def replies(
        self,
        requests: AsyncIterator[Any],
        max_age_s: float,
        hard_limit_s: float,
        streams_open: Gauge,
    ) -> AsyncGenerator[Reply, None]:
        """The stream's replies as they are ready: a goaway after max_age_s,
        the end at hard_limit_s at the latest (the handler's body)."""
        loop = self.loop
        reader = loop.create_task(self.read(requests))
        goaway: Item = (self.reply_type(seq=0, goaway=True), None)
        # Timers, not a timeout per wait: a reply costs one queue get, no timer.
        goaway_timer = loop.call_later(max_age_s, self.out.put_nowait, goaway)
        hard_end = loop.call_later(hard_limit_s, self.out.put_nowait, None)
        streams_open.inc()
        sending: list[Sent] = []
        batch = False
        if self.batches:
            batch = batching(self.context.invocation_metadata())
            await self.context.send_initial_metadata((BATCH_ON,))
        batched = BATCHED.labels(self.name, "reply")
        out = self.out
        held: Item = None  # taken while filling a batch, not a reply: next
        holding = False
        try:
            while True:
                if holding:
                    item, held, holding = held, None, False
                else:
                    item = await out.get()
                if out.qsize() < self.max_in_flight:
                    self.drained.set()
                if item is None:
                    return
                if isinstance(item, Fatal):
                    await self.context.abort(item.code, item.message)
                    return
                reply, sent = item
                if sent is not None:
                    sending.append(sent)
                if batch and not out.empty():
                    holding, held = self._fill(reply, sending, batched)
                yield reply
                # gRPC resumes the handler once the reply is written; if the
                # stream broke, it closes the handler here instead.
                for sent in sending:
                    sent.finish(cancelled=False)
                sending.clear()
        finally:
            if holding and isinstance(held, tuple) and held[1] is not None:
                sending.append(held[1])  # taken for the next write, never sent
            for sent in sending:
                sent.finish(cancelled=True)
            goaway_timer.cancel()
            hard_end.cancel()
            reader.cancel()
            self.close()
            streams_open.dec()

    def _fill(self, reply: Any, sending: list[Sent], batched: Any) -> tuple[bool, Item]:
        """Put the replies queued behind reply in its ``more``, within the
        bounds; (True, item) when it took an item the next write must carry
        (too big to join, or not a reply)."""
        out, size = self.out, reply.ByteSize()
        more: list[Any] = []
        taken: tuple[bool, Item] = (False, None)
        while not out.empty() and len(more) < MAX_BATCH - 1:
            nxt = out.get_nowait()
            if isinstance(nxt, tuple):
                size += nxt[0].ByteSize()
            if not isinstance(nxt, tuple) or size > self.max_batch_bytes:
                taken = (True, nxt)
                break
            more.append(nxt[0])
            if nxt[1] is not None:
                sending.append(nxt[1])
        if more:
            reply.more.extend(more)
            batched.inc(len(more))
        return taken


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call ending with code and details raises."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def reply_error(code: int, message: str) -> grpc.aio.AioRpcError:
    """The error a unary call would raise for a reply message's numeric
    ``code`` and ``message`` (an unknown number: UNKNOWN)."""
    return rpc_error(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


class ClientStream(Generic[Request, Reply]):
    """The caller's state of one open stream: calls in flight by seq, and
    the messages to write (None: half-close). A subclass opens the call and
    reads it, passing each reply to ``received`` and, at the end, the error
    for what was not answered to ``fail_pending``."""

    #: The stream's name in the batching metric.
    name = "stream"

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        #: The server reads batched requests (its response metadata said so).
        self.batch_ok = False
        #: The byte bound of a batch of requests (``batches.batch_bytes``).
        self.max_batch_bytes = MAX_BATCH_BYTES
        #: False once the server said goaway or the stream failed.
        self.accepting = True
        self._seq = 0
        self._out: asyncio.Queue[Request | None] = asyncio.Queue()
        self._half_closed = False

    async def learn_batching(self, call: Any) -> None:
        """Read whether the server takes batched requests (its response
        metadata; call before reading the first reply)."""
        self.batch_ok = batching(await call.initial_metadata())

    async def outgoing(self) -> AsyncIterator[Request]:
        """The messages to write, until the half-close: what queued while
        the previous write was out goes as one batch once the server reads
        them."""
        out = self._out
        batched = BATCHED.labels(self.name, "request")
        held: Request | None = None  # taken while filling a batch: the next write's
        while True:
            msg, held = (held, None) if held is not None else (await out.get(), None)
            if msg is None:
                return
            if not self.batch_ok or out.empty():
                yield msg
                continue
            more: list[Request] = []
            end = False
            size = msg.ByteSize()  # type: ignore[attr-defined]
            while not out.empty() and len(more) < MAX_BATCH - 1:
                nxt = out.get_nowait()
                if nxt is None:
                    end = True
                    break
                size += nxt.ByteSize()  # type: ignore[attr-defined]
                if size > self.max_batch_bytes:
                    held = nxt
                    break
                more.append(nxt)
            if more:
                msg.more.extend(more)  # type: ignore[attr-defined]
                batched.inc(len(more))
            yield msg
            if end:
                return

    def _half_close(self) -> None:
        if not self._half_closed:
            self._half_closed = True
            self._out.put_nowait(None)

    def _half_close_if_done(self) -> None:
        if not self.accepting and not self.pending:
            self._half_close()

    def retire(self) -> None:
        """Take no new requests; half-close once the last reply is in."""
        self.accepting = False
        if not self.pending:
            self._half_close()

    def _new_call(self) -> tuple[int, asyncio.Future[Reply]]:
        """The next seq and the future its reply will settle (the caller
        puts the message tagged with it in ``_out``)."""
        self._seq += 1
        fut: asyncio.Future[Reply] = self.loop.create_future()
        self.pending[self._seq] = fut
        return self._seq, fut

    def control(self, seq: int, goaway: bool) -> bool:
        """Whether a reply is the server's own (seq 0), not a call's; a
        goaway retires the stream."""
        if seq != 0:
            return False
        if goaway:
            self.retire()
        return True

    def take(self, seq: int) -> asyncio.Future[Reply] | None:
        """The future still waiting for seq's reply, if any (no longer pending)."""
        fut = self.pending.pop(seq, None)
        return fut if fut is not None and not fut.done() else None

    def fail_pending(self, err: grpc.aio.AioRpcError) -> None:
        """The stream ended: every call not answered fails with err."""
        self.accepting = False
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._half_close()
