"""Node heartbeats over one ClusterMgr.HeartbeatBatches (or Heartbeats)
stream per ClusterMgr address.

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
- On HeartbeatBatches (the default), the statuses queued while the writer
  was busy or in the same loop turn (the Registrar sends a round's beats
  at once) go as one NodeStatusBatch of at most ``MAX_BATCH``; the server
  answers each batch with the replies of its statuses in order, so the
  FIFO matching is the same as for one status per message, and nothing
  waits for company: a lone status goes at once.
- A ClusterMgr without a method (UNIMPLEMENTED: an older version) gets the
  next way (``heartbeat_modes``: batches, then one status per message, then
  unary Updates); the better one is tried again after ``max_age_s``.
- With the connection cache off (the ablation switch: a channel per call)
  there is no channel for a stream to live on: unary Updates. With
  ``--no-heartbeat-batches``, one status per message on Heartbeats.

At most one status per node is in flight (the Registrar's busy flag), so a
stream's queue holds at most the agent's node count.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

import grpc

from controlplane.nodeagent.heartbeat_modes import MAX_BATCH, HeartbeatModes, Mode
from controlplane.runtime import rpc
from controlplane.runtime.membership import HEARTBEAT_STREAM_MAX_AGE_S
from galaxy.v1 import clustermgr_pb2, clustermgr_pb2_grpc, common_pb2


class StreamEnded(Exception):
    """The stream ended before the status was answered: it was not handled."""


class NoReply(Exception):
    """No reply for a status within its deadline: handled as a failed Update."""


class HeartbeatStream:
    """One open HeartbeatBatches call (batched) or Heartbeats call:
    statuses in, replies matched FIFO."""

    def __init__(
        self, stub: clustermgr_pb2_grpc.ClusterMgrStub, deadline_s: float, batched: bool = True
    ) -> None:
        loop = asyncio.get_running_loop()
        self.opened = loop.time()
        self.batched = batched
        self._queue: asyncio.Queue[common_pb2.NodeStatus | None] = asyncio.Queue()
        self._pending: deque[tuple[str, asyncio.Future[clustermgr_pb2.UpdateReply]]] = deque()
        self._error: BaseException | None = None
        self._closing = False
        # The reader/writer API with our own writer task, not a request
        # iterator: grpc.aio drives an iterator in a task of its own that
        # outlives a cancelled call, and at loop shutdown closing that
        # generator fails.
        # None: no request iterator (the pool's stub proxy wants it positional).
        method = stub.HeartbeatBatches if batched else stub.Heartbeats
        self._call = method(None, timeout=deadline_s)
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
            queue = self._queue
            while (status := await queue.get()) is not None:
                if not self.batched:
                    await self._call.write(status)
                    continue
                # What queued meanwhile goes along (a round's statuses, or
                # those that came while the last write was in flight).
                statuses, end = [status], False
                while len(statuses) < MAX_BATCH and not queue.empty():
                    nxt = queue.get_nowait()
                    if nxt is None:
                        end = True
                        break
                    statuses.append(nxt)
                await self._call.write(clustermgr_pb2.NodeStatusBatch(statuses=statuses))
                if end:
                    break
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
            while (msg := await self._call.read()) is not grpc.aio.EOF:
                if isinstance(msg, clustermgr_pb2.HeartbeatBatchReply):
                    replies, reopen = msg.replies, msg.reopen
                else:
                    assert isinstance(msg, clustermgr_pb2.HeartbeatReply)
                    replies, reopen = [msg], msg.reopen
                problem = self._match(replies)
                if problem is not None:
                    err = StreamEnded(problem)
                    break
                if reopen:
                    self.close()  # the server's maximum age: the next status opens a new one
            else:
                err = StreamEnded("the server ended the stream")
        except grpc.aio.AioRpcError as e:
            err = e
        except asyncio.CancelledError:
            self.abort(StreamEnded("stream cancelled"))
            raise
        self.abort(err)

    def _match(self, replies: Iterable[clustermgr_pb2.HeartbeatReply]) -> str | None:
        """Settle the pending statuses replies answer, in order (a problem:
        the stream can no longer be matched)."""
        pending = self._pending
        for r in replies:
            if not pending:
                return "a reply for no status"
            node_id, fut = pending.popleft()
            if r.node_id != node_id:
                return f"reply for {r.node_id!r}, expected {node_id!r}"
            if not fut.done():
                fut.set_result(r.reply)
        return None

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
        #: The way to each address (the switches; UNIMPLEMENTED answers).
        self.modes = HeartbeatModes(
            batches=pool.config.heartbeat_batches, streams=pool.enabled, retry_s=max_age_s
        )
        #: Streams opened (tests and debugging).
        self.opened = 0

    @property
    def batching(self) -> bool:
        """Whether statuses go in batches where the server takes them."""
        return self.modes.best is Mode.BATCHES

    def mode(self, address: str) -> Mode:
        """How statuses to address go now."""
        return self.modes.mode(address, asyncio.get_running_loop().time())

    def streaming(self, address: str) -> bool:
        """Whether statuses to address go over a stream now."""
        return self.mode(address) is not Mode.UNARY

    async def update(
        self, address: str, stub: clustermgr_pb2_grpc.ClusterMgrStub, status: common_pb2.NodeStatus
    ) -> clustermgr_pb2.UpdateReply:
        """status to the ClusterMgr at address (stub: its pooled stub); the
        reply, or an exception as a failed unary Update raises."""
        loop = asyncio.get_running_loop()
        mode = self.modes.mode(address, loop.time())
        resent = False
        while mode is not Mode.UNARY:
            try:
                s = self._stream(address, stub, mode)
                return await s.update(status, self.rpc_timeout_s)
            except StreamEnded:
                if resent:
                    raise
                resent = True  # not handled: once more on a new stream
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # Not handled either: the next way (batches -> one per message -> unary).
                mode = self.modes.unimplemented(address, mode, loop.time())
                continue
            mode = self.modes.mode(address, loop.time())
        reply: clustermgr_pb2.UpdateReply = await stub.Update(status, timeout=self.rpc_timeout_s)
        return reply

    def _stream(
        self, address: str, stub: clustermgr_pb2_grpc.ClusterMgrStub, mode: Mode
    ) -> HeartbeatStream:
        batched = mode is Mode.BATCHES
        s = self._streams.get(address)
        if s is not None:
            if (
                s.usable
                and s.batched == batched
                and asyncio.get_running_loop().time() - s.opened < self.max_age_s
            ):
                return s
            self._retire(s)  # too old, told to reopen, broken, or the other method
        # The deadline leaves a retired stream time to drain its replies
        # (each due within rpc_timeout_s) and is never what fails a status.
        s = HeartbeatStream(stub, self.max_age_s + 2 * self.rpc_timeout_s + 1.0, batched)
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
