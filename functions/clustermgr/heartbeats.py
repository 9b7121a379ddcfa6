"""ClusterMgr.Heartbeats: node heartbeats over one long-lived stream.

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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.membership import HEARTBEAT_STREAM_MAX_AGE_S
from controlplane.runtime.metrics import HEARTBEAT_STREAMS, RPC_LATENCY, RPC_REQUESTS
from controlplane.runtime.rpc import Undecodable
from galaxy.v1 import clustermgr_pb2, common_pb2

log = logging.getLogger(__name__)

#: The method label of per-status metrics (as the interceptor labels unary RPCs).
METHOD = "ClusterMgr/Heartbeats"

Update = Callable[[common_pb2.NodeStatus], clustermgr_pb2.UpdateReply]


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
    loop = asyncio.get_running_loop()
    reopen_at = loop.time() + limits.max_age_s
    ends = reopen_at + limits.grace_s
    latency = RPC_LATENCY.labels(METHOD)
    HEARTBEAT_STREAMS.inc()
    try:
        it = aiter(requests)
        while True:
            try:
                status = await anext(it)
            except StopAsyncIteration:
                return  # the client half-closed: end with OK
            if isinstance(status, Undecodable):  # (rpc's interceptor decodes tolerantly)
                RPC_REQUESTS.labels(METHOD, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"status: {status.reason}")
            start = time.perf_counter()
            code, message = grpc.StatusCode.OK, ""
            try:
                reply = update(status)
            except GalaxyError as e:
                code, message = e.code, e.message
            except Exception:
                log.exception("unhandled error in %s", METHOD)
                code, message = grpc.StatusCode.INTERNAL, f"internal error in {METHOD}"
            latency.observe(time.perf_counter() - start)
            RPC_REQUESTS.labels(METHOD, code.name).inc()
            if code is not grpc.StatusCode.OK:
                await context.abort(code, message)
            now = loop.time()
            yield clustermgr_pb2.HeartbeatReply(
                node_id=status.node_id, reply=reply, reopen=now >= reopen_at
            )
            if now >= ends:
                return
    finally:
        HEARTBEAT_STREAMS.dec()
