"""The caller's side of ``NodeAgent.InstanceStream``: CreateInstance and
DeleteInstance as messages on one stream per node agent address.

Dispatch (creates from credits, deletes) and Schedule (creates, undoes)
call node agents once or twice per cold start; on grpc.aio a message on an
open stream costs the agent less than half of a unary call's CPU and the
caller about two thirds (docs/results/benchmarks-2026-11.md, 2026-11-26,
commits 35f1747 and 8cdffeb). To the
caller nothing changes: ``AgentCalls.create`` and ``delete`` answer what
the unary call answers or raise the
``grpc.aio.AioRpcError`` it would raise (same code and message), so retries
and spilling stay where they are.

- Requests carry a ``seq``; replies come as they are ready and are matched
  by it. Each request has its deadline (sent as ``timeout_ms`` and kept
  here by a timer: DEADLINE_EXCEEDED as a unary call).
- A stream that breaks fails every request it has not answered with
  UNAVAILABLE (as a unary call whose connection dropped): the callers'
  retry logic for UNAVAILABLE applies. A later request opens a new stream.
- After the agent's goaway (30 s) the stream takes no new requests and is
  half-closed once its last reply is in; the next request opens a new one.
- Unary calls instead, per request: when streams are off (``RpcConfig.
  agent_streams`` false, or the connection cache is: there is no channel
  for a stream to live on), when the agent does not know the method
  (UNIMPLEMENTED: an older agent) or ended the last stream with an error
  before answering anything (tried again after ``RETRY_STREAM_S`` both),
  or when ``MAX_IN_FLIGHT`` requests are already out on the stream.
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
from controlplane.runtime.validation import STARTUP_TIMEOUT_MS_MAX
from galaxy.v1 import nodeagent_pb2, nodeagent_pb2_grpc

#: The stream's bounds, the agent's and the caller's: requests in flight on
#: one stream, and the longest deadline a request may name (the longest
#: sandbox start a spec may ask for, plus the callers' margins).
MAX_IN_FLIGHT = 1024
MAX_TIMEOUT_MS = STARTUP_TIMEOUT_MS_MAX + 60_000
#: The stream's own deadline: a backstop, the agent ends it by 695 s.
STREAM_DEADLINE_S = 760.0
#: After an UNIMPLEMENTED, the address gets unary calls this long.
RETRY_STREAM_S = 30.0
#: A stream refused when it opens ends with the status the unary call would
#: get (UNIMPLEMENTED: an older agent, the caller falls back; the guards'
#: refusals): passed on as they are, not as a broken stream.
_AS_UNARY = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)

Reply = nodeagent_pb2.InstanceStreamReply


class _Stream(multiplex.ClientStream[nodeagent_pb2.InstanceStreamRequest, Reply]):
    """One open InstanceStream: requests in flight by seq."""

    name = "InstanceStream"

    def __init__(self, address: str, stub: Any, on_closed: Callable[[_Stream], None]) -> None:
        super().__init__()
        self.address = address
        self._on_closed = on_closed
        #: Replies received, and whether the stream ended with an error.
        self.answered = 0
        self.failed = False
        # The reader/writer API with a writer task of our own, not a request
        # iterator: grpc.aio drives an iterator in a task that outlives a
        # cancelled call (see controlplane.nodeagent.heartbeat_stream).
        self.call = stub.InstanceStream(
            None, timeout=STREAM_DEADLINE_S, metadata=(batches.BATCH_ON,)
        )
        self._writer = self.loop.create_task(self._write(), name="instance-stream-writer")
        self.reader = self.loop.create_task(self._read(), name="instance-stream-reader")

    async def _write(self) -> None:
        try:
            async for msg in self.outgoing():
                await self.call.write(msg)
            await self.call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the call ended: the reader fails what is pending, with its status
        except Exception:  # never leave a stream half-working
            self.call.cancel()

    async def _read(self) -> None:
        err = rpc_error(grpc.StatusCode.UNAVAILABLE, "the node agent ended the InstanceStream")
        try:
            await self.learn_batching(self.call)
            while (msg := await self.call.read()) is not grpc.aio.EOF:
                assert isinstance(msg, Reply)
                for r in batches.items(msg):
                    if self.control(r.seq, r.goaway):
                        continue
                    self.answered += 1
                    fut = self.take(r.seq)
                    if fut is not None:
                        fut.set_result(r)
                    self._half_close_if_done()
        except grpc.aio.AioRpcError as e:
            self.failed = True
            if e.code() in _AS_UNARY:
                err = e  # what the unary call would have answered too
            else:
                # Whatever ended it (a dead peer ends a stream INTERNAL or
                # UNAVAILABLE; a protocol error INVALID_ARGUMENT), the
                # requests not answered may not have been handled: the
                # status a unary call gets when its connection drops.
                err = rpc_error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the InstanceStream to the node agent broke ({e.code().name}: {e.details()})",
                )
        except asyncio.CancelledError:
            err = rpc_error(grpc.StatusCode.CANCELLED, "the InstanceStream was closed")
            raise
        finally:
            self.fail_pending(err)
            self._on_closed(self)

    def _expire(self, seq: int) -> None:
        fut = self.pending.pop(seq, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded (InstanceStream)")
            )
        self._half_close_if_done()

    async def request(self, msg: nodeagent_pb2.InstanceStreamRequest, timeout_s: float) -> Reply:
        """Send msg (its seq is set here); its reply, or the error that ended it."""
        seq, fut = self._new_call()
        msg.seq = seq
        # Never more than the agent takes (the timer here keeps the rest).
        msg.timeout_ms = min(max(1, int(timeout_s * 1000)), MAX_TIMEOUT_MS)
        self._out.put_nowait(msg)
        # A timer, not wait_for: no task per request.
        timer = self.loop.call_later(timeout_s, self._expire, seq)
        try:
            return await fut
        finally:
            timer.cancel()
            if self.pending.get(seq) is fut:  # the caller gave up (cancelled)
                del self.pending[seq]
                self._half_close_if_done()

    def cancel(self) -> None:
        """End the stream now (what is in flight fails CANCELLED)."""
        self.call.cancel()
        self._writer.cancel()


class AgentCalls:
    """CreateInstance and DeleteInstance of one process, over a stream per
    node agent address where possible (see module docstring). pool: the
    process's ChannelPool, read at each call (a component rebinds it)."""

    def __init__(self, pool: Callable[[], ChannelPool]) -> None:
        self._pool = pool
        self._streams: dict[str, _Stream] = {}
        self._live: set[_Stream] = set()
        # Address -> loop time until which it gets unary calls (UNIMPLEMENTED).
        self._unary_until: dict[str, float] = {}
        #: Calls sent as stream messages and as unary calls.
        self.sent = {"stream": 0, "unary": 0}
        #: Streams opened (a goaway or a failure makes the next one).
        self.opened = 0

    def streaming(self, address: str) -> bool:
        """Whether calls to address go over a stream now."""
        pool = self._pool()
        if not (pool.enabled and pool.config.agent_streams):
            return False
        until = self._unary_until.get(address)
        return until is None or asyncio.get_running_loop().time() >= until

    async def create(
        self, address: str, req: nodeagent_pb2.CreateInstanceRequest, timeout_s: float
    ) -> nodeagent_pb2.CreateInstanceReply:
        """CreateInstance at address; raises grpc.aio.AioRpcError."""
        r = await self._call(address, nodeagent_pb2.InstanceStreamRequest(create=req), timeout_s)
        if r is not None:
            return r.created
        async with self._pool().stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
            return await s.CreateInstance(req, timeout=timeout_s)  # type: ignore[no-any-return]

    async def delete(
        self,
        address: str,
        req: nodeagent_pb2.DeleteInstanceRequest,
        timeout_s: float | None = None,
    ) -> nodeagent_pb2.DeleteInstanceReply:
        """DeleteInstance at address (timeout: the pool's deadline when None)."""
        timeout = self._pool().timeout if timeout_s is None else timeout_s
        r = await self._call(address, nodeagent_pb2.InstanceStreamRequest(delete=req), timeout)
        if r is not None:
            return r.deleted
        async with self._pool().stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
            return await s.DeleteInstance(req, timeout=timeout)  # type: ignore[no-any-return]

    async def _call(
        self, address: str, msg: nodeagent_pb2.InstanceStreamRequest, timeout_s: float
    ) -> Reply | None:
        """The reply on a stream, or None: send it as a unary call."""
        if not self.streaming(address):
            self.sent["unary"] += 1
            return None
        stream = await self._stream(address)
        if len(stream.pending) >= MAX_IN_FLIGHT:
            self.sent["unary"] += 1
            return None
        self.sent["stream"] += 1
        try:
            r = await stream.request(msg, timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary_until[address] = asyncio.get_running_loop().time() + RETRY_STREAM_S
            self.sent["unary"] += 1
            return None
        if r.code:
            raise reply_error(r.code, r.message)
        return r

    async def _stream(self, address: str) -> _Stream:
        stream = self._streams.get(address)
        if stream is not None and stream.accepting:
            return stream
        async with self._pool().stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
            stream = _Stream(address, s, self._closed)
        stream.max_batch_bytes = batches.batch_bytes(self._pool().config.max_message_bytes)
        self._live.add(stream)
        self._streams[address] = stream
        self.opened += 1
        return stream

    def _closed(self, stream: _Stream) -> None:
        self._live.discard(stream)
        if stream.failed and not stream.answered:
            # Streams do not work with this peer (it ends them before any
            # reply: a server whose servicer only has the base class's stub
            # ends it INTERNAL, not UNIMPLEMENTED; or a proxy in between):
            # unary calls for a while, as after an UNIMPLEMENTED. The calls
            # the stream carried failed UNAVAILABLE and are retried so.
            until = asyncio.get_running_loop().time() + RETRY_STREAM_S
            self._unary_until[stream.address] = until
        for address in [a for a, s in self._streams.items() if s is stream]:
            del self._streams[address]

    async def close(self) -> None:
        """Cancel every stream (what is in flight fails CANCELLED)."""
        streams = list(self._live)
        self._streams.clear()
        for s in streams:
            s.cancel()
        for s in streams:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await s.reader
