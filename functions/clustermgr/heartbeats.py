"""ClusterMgr.Heartbeats and HeartbeatBatches: node heartbeats over one
long-lived stream.

A node agent sends the statuses of all its nodes that this instance owns
over one bidirectional stream instead of one unary Update each: on grpc.aio
a message on an open stream costs the server about a third of the CPU of a
unary call. Every status goes through the servicer's ``update``, the same
code as Update, and is answered by one HeartbeatReply, in order.

What one stream may hold here is bounded: a status is read, handled and its
reply written (awaited) before the next is read, so nothing queues in this
process; a client sending ahead is held back by HTTP/2 flow control.

No stream lives without an end. Once it is ``StreamLimits.max_age_s`` old,
every reply carries ``reopen``: the client sends its next statuses on a new
stream and half-closes this one, which the server ends (OK) once it has
answered everything before the half-close, so no beat is lost. Ending it
from this side instead would race the client's writes (grpc.aio then
reports INTERNAL on the client, not OK). A client that ignores ``reopen``
is cut off ``grace_s`` later, right after a reply; statuses it sent after
that one were never read (the client also gives every stream a deadline).

A status that fails validation ends the stream with INVALID_ARGUMENT and the
validation message, which names the field (never the status itself nor a
traceback); the client's statuses are all well-formed, so this is a bug or a
foreign client, and ending the stream makes it loud. Each status is counted
in the RPC metrics under ``ClusterMgr/Heartbeats`` with its code, and open
streams in the ``galaxy_heartbeat_streams`` gauge.

``HeartbeatBatches`` is the same stream with a NodeStatusBatch per message
(the statuses of one node agent's nodes due in the same round) answered by
one HeartbeatBatchReply: one message, one read and one write for many
nodes. A batch is checked whole (``check_batch``) before any of its
statuses is handled; each batch counts once under
``ClusterMgr/HeartbeatBatches`` and its size in
``galaxy_heartbeat_batch_statuses``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.membership import HEARTBEAT_STREAM_MAX_AGE_S
from controlplane.runtime.metrics import HEARTBEAT_STREAMS, RPC_LATENCY, RPC_REQUESTS
from controlplane.runtime.rpc import Undecodable
from galaxy.v1 import clustermgr_pb2, common_pb2

log = logging.getLogger(__name__)

#: The method label of per-status metrics (as the interceptor labels unary RPCs).
METHOD = "ClusterMgr/Heartbeats"
#: The method label of per-batch metrics.
BATCH_METHOD = "ClusterMgr/HeartbeatBatches"
#: Most statuses one NodeStatusBatch may carry (the agent sends at most this).
MAX_BATCH = 256

Update = Callable[[common_pb2.NodeStatus], clustermgr_pb2.UpdateReply]
#: Answers one batch (reopen: the stream is past its maximum age).
UpdateBatch = Callable[[clustermgr_pb2.NodeStatusBatch, bool], clustermgr_pb2.HeartbeatBatchReply]

Reply = TypeVar("Reply")


def check_batch(batch: clustermgr_pb2.NodeStatusBatch) -> str | None:
    """What is wrong with batch, naming the field and index (None: nothing).
    Never quotes what was sent."""
    n = len(batch.statuses)
    if n == 0:
        return "statuses: a batch holds at least one status"
    if n > MAX_BATCH:
        return f"statuses: {n} statuses, at most {MAX_BATCH} per batch"
    first: dict[str, int] = {}
    for i, s in enumerate(batch.statuses):
        nid = s.node_id
        if not nid:
            return f"statuses[{i}].node_id: must be set"
        j = first.setdefault(nid, i)
        if j != i:
            return f"statuses[{i}].node_id: the same node as statuses[{j}]"
    return None


@dataclass
class StreamLimits:
    """Limits of one ClusterMgr's heartbeat streams."""

    #: Replies ask the client to reopen the stream after this long.
    max_age_s: float = HEARTBEAT_STREAM_MAX_AGE_S
    #: A stream still open this long after max_age_s is ended (OK) after a reply.
    grace_s: float = 10.0


async def serve(
    update: Update,
    requests: AsyncIterator[common_pb2.NodeStatus],
    context: grpc.aio.ServicerContext,
    limits: StreamLimits,
) -> AsyncIterator[clustermgr_pb2.HeartbeatReply]:
    """Answer every status of requests with update(status), in order, until
    the client half-closes, the stream outlives its grace, or a status
    fails validation (INVALID_ARGUMENT). Exceptions never escape as a
    traceback to the client: the stream ends with a short status."""

    def answer(status: common_pb2.NodeStatus, reopen: bool) -> clustermgr_pb2.HeartbeatReply:
        return clustermgr_pb2.HeartbeatReply(
            node_id=status.node_id, reply=update(status), reopen=reopen
        )

    async for reply in _serve(answer, requests, context, limits, METHOD, "status"):
        yield reply


async def serve_batches(
    update_batch: UpdateBatch,
    requests: AsyncIterator[clustermgr_pb2.NodeStatusBatch],
    context: grpc.aio.ServicerContext,
    limits: StreamLimits,
) -> AsyncIterator[clustermgr_pb2.HeartbeatBatchReply]:
    """``serve`` for HeartbeatBatches: update_batch(batch, reopen) answers
    each batch (raising InvalidArgument for a bad one)."""
    async for reply in _serve(update_batch, requests, context, limits, BATCH_METHOD, "batch"):
        yield reply


async def _serve(
    answer: Callable[[Any, bool], Reply],
    requests: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    limits: StreamLimits,
    method: str,
    what: str,
) -> AsyncIterator[Reply]:
    """The loop both methods share: answer(message, reopen) per message."""
    loop = asyncio.get_running_loop()
    reopen_at = loop.time() + limits.max_age_s
    ends = reopen_at + limits.grace_s
    latency = RPC_LATENCY.labels(method)
    HEARTBEAT_STREAMS.inc()
    try:
        it = aiter(requests)
        while True:
            try:
                msg = await anext(it)
            except StopAsyncIteration:
                return  # the client half-closed: end with OK
            if isinstance(msg, Undecodable):  # (rpc's interceptor decodes tolerantly)
                RPC_REQUESTS.labels(method, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {msg.reason}")
            start = time.perf_counter()
            code, message = grpc.StatusCode.OK, ""
            now = loop.time()
            try:
                reply = answer(msg, now >= reopen_at)
            except GalaxyError as e:
                code, message = e.code, e.message
            except Exception:
                log.exception("unhandled error in %s", method)
                code, message = grpc.StatusCode.INTERNAL, f"internal error in {method}"
            latency.observe(time.perf_counter() - start)
            RPC_REQUESTS.labels(method, code.name).inc()
            if code is not grpc.StatusCode.OK:
                await context.abort(code, message)
            yield reply
            if now >= ends:
                return
    finally:
        HEARTBEAT_STREAMS.dec()
