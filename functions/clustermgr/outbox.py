"""ClusterMgr's outbox of ModNode messages to Schedule instances: one queue
per Schedule address, drained by one task per address (ModNodes RPCs of up
to ``batch`` messages). What is sent when (newest message per node wins,
news goes at once, a message that may wait for company waits up to its
``wait_s``, retries with backoff) is decided by ``OutboxQueue``
(``functions/clustermgr/outbox_queue.py``, pure; the simulator drives the
same object); this module performs it: the waits, the RPCs, the counters.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from controlplane.runtime import rpc
from functions.clustermgr.outbox_queue import BATCH, Entry, OutboxQueue
from galaxy.v1 import schedule_pb2
from galaxy.v1 import schedule_pb2_grpc as sf_grpc

log = logging.getLogger(__name__)

UPSERT = schedule_pb2.ModNodeRequest.OP_UPSERT
REMOVE = schedule_pb2.ModNodeRequest.OP_REMOVE

__all__ = ["BATCH", "REMOVE", "UPSERT", "Outbox"]

_Queue = OutboxQueue[schedule_pb2.ModNodeRequest]
_Entry = Entry[schedule_pb2.ModNodeRequest]


class Outbox:
    """ModNode messages to Schedule instances, in order per node, newest
    wins. A failed message is retried (up to ``tries`` sends, with backoff)
    unless a newer one for the node was queued meanwhile.

    A message may wait for company (``put(..., wait_s=...)``: a refresh of
    an unchanged status, or a status the owner's view already counts;
    ``functions.clustermgr.forwarding`` says how long); news sends the
    queue at once. Heartbeats arrive spread over the period, so without the
    wait each refresh found an empty queue and went alone: a ModNodes RPC
    per ~2 messages, each costing Schedule far more in gRPC wake-ups than
    the upserts.
    """

    def __init__(
        self,
        pool: rpc.ChannelPool,
        *,
        timeout_s: float = 2.0,
        batch: int = BATCH,
        tries: int = 3,
        backoff_s: float = 0.1,
    ) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.batch = batch
        self.tries = tries
        self.backoff_s = backoff_s
        #: messages sent, given up, and ModNodes RPCs made (batches)
        self.sent = 0
        self.failed = 0
        self.calls = 0
        self._queues: dict[str, _Queue] = {}
        # address -> set when put() brought the queue's next send forward
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, address: str, req: schedule_pb2.ModNodeRequest, *, wait_s: float = 0.0) -> None:
        """Queue req for the Schedule instance at address; it may wait up to
        wait_s for company (see the class docstring)."""
        q = self._queues.get(address)
        if q is None:
            q = self._queues[address] = OutboxQueue(
                batch=self.batch, tries=self.tries, backoff_s=self.backoff_s
            )
        loop = asyncio.get_running_loop()
        sooner = q.put(
            req.node.node_id, req, now=loop.time(), wait_s=wait_s, remove=req.op == REMOVE
        )
        if address not in self._tasks:
            self._idle.clear()
            wake = self._wake[address] = asyncio.Event()
            self._tasks[address] = asyncio.create_task(self._drain(address, q, wake))
        elif sooner is not None:
            self._wake[address].set()

    async def flush(self) -> None:
        """Wait until every queued message was sent or given up."""
        await self._idle.wait()

    async def close(self) -> None:
        """Stop sending; unsent messages are dropped (heartbeats resend)."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, address: str, q: _Queue, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        try:
            now = loop.time()
            while True:
                r = q.poll(now)
                if r is None:
                    break  # idle
                if not isinstance(r, list):
                    # Wait until r: a linger (a put due sooner wakes us)
                    # or a backoff (put never wakes us then).
                    wake.clear()
                    try:
                        await asyncio.wait_for(wake.wait(), r - now)
                        now = loop.time()
                    except TimeoutError:
                        # The timer may fire a clock tick early: it is due.
                        now = max(loop.time(), r)
                    continue
                err = await self._send_batch(address, r)
                self.calls += 1
                now = loop.time()
                if err is None:
                    self.sent += len(r)
                    q.sent(now)
                    continue
                _, lost = q.failed(now)
                for e in lost:
                    self.failed += 1
                    log.warning(
                        "ModNode %s for %s to %s lost: %s", e.item.op, e.node_id, address, err
                    )
        finally:
            # No await between poll's None and here: put() cannot slip a
            # message in that no task would send.
            del self._tasks[address]
            if not q.idle:
                q.halt()  # cancelled: a call in flight is lost
            if not q:
                del self._queues[address]
                del self._wake[address]
            if not self._tasks:
                self._idle.set()

    async def _send_batch(self, address: str, items: list[_Entry]) -> Exception | None:
        changes: list[schedule_pb2.ModNodeRequest] = []
        for e in items:
            if e.reset:
                changes.append(schedule_pb2.ModNodeRequest(op=REMOVE, node=e.item.node))
            changes.append(e.item)
        try:
            async with self.pool.stub(address, sf_grpc.ScheduleStub) as stub:
                await stub.ModNodes(
                    schedule_pb2.ModNodesRequest(changes=changes), timeout=self.timeout_s
                )
        except grpc.aio.AioRpcError as e:
            return e
        return None
