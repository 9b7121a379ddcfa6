"""Node heartbeats over one ClusterMgr.Heartbeats stream per ClusterMgr address.

On grpc.aio a unary call costs both sides several times the CPU of one
message on an open stream, and a node agent sends one heartbeat per node per
second. So the heartbeats of all nodes an agent process has at one
ClusterMgr instance share one bidirectional stream; ``Streams.update`` sends
a status and returns the UpdateReply exactly as a unary Update would, or
raises as a failed Update would, so the caller's handling (backoff,
re-register, wrong_owner) is the same for both.

- Replies come in the order of the statuses (the server answers one by one),
  so they are matched FIFO and checked by node id.
- Each status keeps the unary deadline: no reply within it fails the status
  and drops the stream (a later reply could no longer be matched), and the
  next status opens a new one.
- A stream is retired (half-closed; it drains) once it is ``max_age_s`` old
  or a reply says ``reopen`` (the server's maximum age), and has a deadline
  a margin beyond that. Should the server end a stream before answering a
  status, the status was not handled and is sent again, once, on a new
  stream: no beat is lost.
- A ClusterMgr without the method (UNIMPLEMENTED: an older version) gets
  unary Updates; the stream is tried again after ``max_age_s``.
- With the connection cache off (the ablation switch: a channel per call)
  there is no channel for a stream to live on: unary Updates.

At most one status per node is in flight (the Registrar's busy flag), so a
stream's queue holds at most the agent's node count.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.membership import HEARTBEAT_STREAM_MAX_AGE_S
from galaxy.v1 import clustermgr_pb2, clustermgr_pb2_grpc, common_pb2


class StreamEnded(Exception):
    """The stream ended before the status was answered: it was not handled."""


class NoReply(Exception):
    """No reply for a status within its deadline: handled as a failed Update."""


class HeartbeatStream:
    """One open Heartbeats call: statuses in, replies matched FIFO."""

    def __init__(self, stub: clustermgr_pb2_grpc.ClusterMgrStub, deadline_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.opened = loop.time()
        self._queue: asyncio.Queue[common_pb2.NodeStatus | None] = asyncio.Queue()
        self._pending: deque[tuple[str, asyncio.Future[clustermgr_pb2.UpdateReply]]] = deque()
        self._error: BaseException | None = None
        self._closing = False
        # The reader/writer API with our own writer task, not a request
        # iterator: grpc.aio drives an iterator in a task of its own that
        # outlives a cancelled call, and at loop shutdown closing that
        # generator fails.
        # None: no request iterator (the pool's stub proxy wants it positional).
        self._call = stub.Heartbeats(None, timeout=deadline_s)
        self._writer = asyncio.create_task(self._write(), name="heartbeat-stream-writer")
        self.reader = asyncio.create_task(self._read(), name="heartbeat-stream-reader")

    @property
    def usable(self) -> bool:
        """True while new statuses may be sent on it."""
        return self._error is None and not self._closing

    async def update(
        self, status: common_pb2.NodeStatus, timeout_s: float
    ) -> clustermgr_pb2.UpdateReply:
        """Send status; its reply, or the stream's error (StreamEnded: not
        handled, send it again; NoReply or an AioRpcError: failed)."""
        if not self.usable:
            raise StreamEnded("stream closed")
        fut: asyncio.Future[clustermgr_pb2.UpdateReply] = asyncio.get_running_loop().create_future()
        self._pending.append((status.node_id, fut))
        self._queue.put_nowait(status)
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            err = NoReply(f"no reply on the Heartbeats stream within {timeout_s:g}s")
            self.abort(err)
            raise err from None

    def close(self) -> None:
        """Half-close: send nothing more; replies still pending arrive."""
        if not self._closing:
            self._closing = True
            self._queue.put_nowait(None)

    def abort(self, err: BaseException) -> None:
        """Drop the stream: every pending status fails with err."""
        self._fail(err)
        self._call.cancel()
        self._writer.cancel()

    async def wait_closed(self) -> None:
        """Until both tasks have finished."""
        await asyncio.gather(self._writer, self.reader, return_exceptions=True)

    async def _write(self) -> None:
        try:
            while (status := await self._queue.get()) is not None:
                await self._call.write(status)
            await self._call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # The call ended: the reader reports how, with the call's status
            # (UNIMPLEMENTED must reach Streams.update as such).
            pass
        except Exception as e:  # never leave a stream half-working
            self.abort(StreamEnded(f"writing failed: {type(e).__name__}"))

    async def _read(self) -> None:
        err: BaseException
        try:
            while (r := await self._call.read()) is not grpc.aio.EOF:
                assert isinstance(r, clustermgr_pb2.HeartbeatReply)
                if not self._pending:
                    err = StreamEnded("a reply for no status")
                    break
                node_id, fut = self._pending.popleft()
                if r.node_id != node_id:
                    err = StreamEnded(f"reply for {r.node_id!r}, expected {node_id!r}")
                    break
                if not fut.done():
                    fut.set_result(r.reply)
                if r.reopen:
                    self.close()  # the server's maximum age: the next status opens a new one
            else:
                err = StreamEnded("the server ended the stream")
        except grpc.aio.AioRpcError as e:
            err = e
        except asyncio.CancelledError:
            self.abort(StreamEnded("stream cancelled"))
            raise
        self.abort(err)

    def _fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        while self._pending:
            _, fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(err)


class Streams:
    """The heartbeat streams of one node agent process, by ClusterMgr address."""

    def __init__(
        self,
        pool: rpc.ChannelPool,
        *,
        rpc_timeout_s: float,
        max_age_s: float = HEARTBEAT_STREAM_MAX_AGE_S,
    ) -> None:
        self.pool = pool
        self.rpc_timeout_s = rpc_timeout_s
        self.max_age_s = max_age_s
        self._streams: dict[str, HeartbeatStream] = {}
        # Retired streams still draining their last replies.
        self._draining: set[HeartbeatStream] = set()
        # Address -> loop time until which it gets unary Updates (UNIMPLEMENTED).
        self._unary: dict[str, float] = {}
        #: Streams opened (tests and debugging).
        self.opened = 0

    def streaming(self, address: str) -> bool:
        """Whether statuses to address go over a stream now."""
        until = self._unary.get(address)
        return self.pool.enabled and (until is None or asyncio.get_running_loop().time() >= until)

    async def update(
        self, address: str, stub: clustermgr_pb2_grpc.ClusterMgrStub, status: common_pb2.NodeStatus
    ) -> clustermgr_pb2.UpdateReply:
        """status to the ClusterMgr at address (stub: its pooled stub); the
        reply, or an exception as a failed unary Update raises."""
        for attempt in range(2):
            if not self.streaming(address):
                break
            try:
                return await self._stream(address, stub).update(status, self.rpc_timeout_s)
            except StreamEnded:
                if attempt:
                    raise
                continue  # not handled: once more on a new stream
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                until = asyncio.get_running_loop().time() + self.max_age_s
                self._unary[address] = until
        reply: clustermgr_pb2.UpdateReply = await stub.Update(status, timeout=self.rpc_timeout_s)
        return reply

    def _stream(self, address: str, stub: clustermgr_pb2_grpc.ClusterMgrStub) -> HeartbeatStream:
        s = self._streams.get(address)
        if s is not None:
            if s.usable and asyncio.get_running_loop().time() - s.opened < self.max_age_s:
                return s
            self._retire(s)  # too old, told to reopen, or broken
        # The deadline leaves a retired stream time to drain its replies
        # (each due within rpc_timeout_s) and is never what fails a status.
        s = HeartbeatStream(stub, self.max_age_s + 2 * self.rpc_timeout_s + 1.0)
        self._streams[address] = s
        self.opened += 1
        return s

    def _retire(self, s: HeartbeatStream) -> None:
        s.close()
        if not s.reader.done():
            self._draining.add(s)
            s.reader.add_done_callback(lambda _: self._draining.discard(s))

    def retain(self, addresses: set[str]) -> None:
        """Retire the streams to addresses not in addresses (no node there)."""
        for address in [a for a in self._streams if a not in addresses]:
            self._retire(self._streams.pop(address))

    async def close(self) -> None:
        """Cancel every stream."""
        streams = [*self._streams.values(), *self._draining]
        self._streams.clear()
        self._draining.clear()
        for s in streams:
            s.abort(StreamEnded("closed"))
            s.reader.cancel()
        for s in streams:
            await s.wait_closed()
