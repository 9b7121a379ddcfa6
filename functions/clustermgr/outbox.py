"""ClusterMgr's outbox of ModNode messages to Schedule instances: one queue
per Schedule address in which the newest message per node replaces an
unsent older one, drained by one task per address (ModNodes RPCs of up to
``batch`` messages). Changes go at once; refreshes of unchanged statuses
may linger (``linger_s``) so that they travel together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

import grpc

from controlplane.runtime import rpc
from galaxy.v1 import schedule_pb2
from galaxy.v1 import schedule_pb2_grpc as sf_grpc

log = logging.getLogger(__name__)

UPSERT = schedule_pb2.ModNodeRequest.OP_UPSERT
REMOVE = schedule_pb2.ModNodeRequest.OP_REMOVE

#: Most ModNode messages one ModNodes RPC carries (the simulator's model of
#: this outbox uses it too).
BATCH = 64

#: A queued ModNode: (message, sends tried, send a REMOVE first, urgent).
_Item = tuple[schedule_pb2.ModNodeRequest, int, bool, bool]


class Outbox:
    """ModNode messages to Schedule instances, in order per node, newest
    wins. A failed message is retried (up to ``tries`` sends, with backoff)
    unless a newer one for the node was queued meanwhile.

    linger_s: how long a queue holding only refreshes (``put(...,
    urgent=False)``: an unchanged status Schedule already has) waits for
    more before it is sent; an urgent message sends the queue at once.
    Heartbeats arrive spread over the period, so without it each refresh
    found an empty queue and went alone: a ModNodes RPC per ~2 messages,
    each costing Schedule far more in gRPC wake-ups than the upserts.
    """

    def __init__(
        self,
        pool: rpc.ChannelPool,
        *,
        timeout_s: float = 2.0,
        batch: int = BATCH,
        tries: int = 3,
        backoff_s: float = 0.1,
        linger_s: float = 0.0,
    ) -> None:
        if linger_s < 0:
            raise ValueError("linger_s must be >= 0")
        self.pool = pool
        self.timeout_s = timeout_s
        self.batch = batch
        self.tries = tries
        self.backoff_s = backoff_s
        self.linger_s = linger_s
        #: messages sent, given up, and ModNodes RPCs made (batches)
        self.sent = 0
        self.failed = 0
        self.calls = 0
        # address -> node_id -> queued message
        self._queues: dict[str, OrderedDict[str, _Item]] = {}
        # address -> set while an urgent message is queued there
        self._urgent: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, address: str, req: schedule_pb2.ModNodeRequest, *, urgent: bool = True) -> None:
        """Queue req for the Schedule instance at address. urgent=False: a
        refresh that may linger (see the class docstring)."""
        q = self._queues.setdefault(address, OrderedDict())
        prev = q.pop(req.node.node_id, None)
        # An UPSERT may replace a pending REMOVE only by carrying it along:
        # REMOVE + UPSERT means "forget the old incarnation, learn this one".
        reset = prev is not None and req.op == UPSERT and (prev[0].op == REMOVE or prev[2])
        # A refresh replacing an unsent change still carries news.
        urgent = urgent or (prev is not None and prev[3])
        q[req.node.node_id] = (req, 0, reset, urgent)
        wake = self._urgent.setdefault(address, asyncio.Event())
        if urgent:
            wake.set()
        if address not in self._tasks:
            self._idle.clear()
            self._tasks[address] = asyncio.create_task(self._drain(address))

    async def flush(self) -> None:
        """Wait until every queued message was sent or given up."""
        await self._idle.wait()

    async def close(self) -> None:
        """Stop sending; unsent messages are dropped (heartbeats resend)."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, address: str) -> None:
        q = self._queues[address]
        urgent = self._urgent[address]
        failures = 0
        try:
            while q:
                if self.linger_s > 0 and not urgent.is_set():
                    # Only refreshes queued: let more join them.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(urgent.wait(), self.linger_s)
                urgent.clear()
                # Then send all that is queued, in batches (what arrives
                # meanwhile goes too: the round is paid for).
                while q:
                    items = [q.popitem(last=False)[1] for _ in range(min(self.batch, len(q)))]
                    # One message per node per batch and batches in sequence,
                    # so the order per node holds; a batch is one ModNodes RPC.
                    err = await self._send_batch(address, items)
                    self.calls += 1
                    if err is None:
                        self.sent += len(items)
                        failures = 0
                        continue
                    failures += 1
                    for req, tried, reset, hurry in items:
                        nid = req.node.node_id
                        if tried + 1 < self.tries and nid not in q:
                            q[nid] = (req, tried + 1, reset, hurry)
                            if hurry:
                                urgent.set()
                        else:
                            self.failed += 1
                            log.warning(
                                "ModNode %s for %s to %s lost: %s", req.op, nid, address, err
                            )
                    await asyncio.sleep(self.backoff_s * 2 ** min(failures - 1, 5))  # backoff
                    break  # a retry of refreshes alone may linger again
        finally:
            # No await between the loop's last check and here: put() cannot
            # slip a message in that no task would send.
            del self._tasks[address]
            if not q:
                del self._queues[address]
                del self._urgent[address]
            if not self._tasks:
                self._idle.set()

    async def _send_batch(self, address: str, items: list[_Item]) -> Exception | None:
        changes: list[schedule_pb2.ModNodeRequest] = []
        for req, _, reset, _ in items:
            if reset:
                changes.append(schedule_pb2.ModNodeRequest(op=REMOVE, node=req.node))
            changes.append(req)
        try:
            async with self.pool.stub(address, sf_grpc.ScheduleStub) as stub:
                await stub.ModNodes(
                    schedule_pb2.ModNodesRequest(changes=changes), timeout=self.timeout_s
                )
        except grpc.aio.AioRpcError as e:
            return e
        return None
