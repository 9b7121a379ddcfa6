"""ClusterMgr.Heartbeats: node heartbeats over one long-lived stream.

A node agent sends the statuses of all its nodes that this instance owns
over one bidirectional stream instead of one unary Update each: on grpc.aio
a message on an open stream costs the server about a third of the CPU of a
unary call. Every status goes through the servicer's ``update``, the same
code as Update, and is answered by one HeartbeatReply, in order.

What one stream may hold here is bounded: a status is read, handled and its
reply written (awaited) before the next is read, so nothing queues in this
process; a client sending ahead is held back by HTTP/2 flow control.

No stream lives without an end: after ``StreamLimits.max_age_s`` the server
ends it with status OK, right after answering a status. Statuses the client
sent after that one were never read, so it sends them again on a new stream
and no beat is lost (the client also gives every stream a deadline).

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
from google.protobuf.message import DecodeError

from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.membership import HEARTBEAT_STREAM_MAX_AGE_S
from controlplane.runtime.metrics import HEARTBEAT_STREAMS, RPC_LATENCY, RPC_REQUESTS
from galaxy.v1 import clustermgr_pb2, common_pb2

log = logging.getLogger(__name__)

#: The method label of per-status metrics (as the interceptor labels unary RPCs).
METHOD = "ClusterMgr/Heartbeats"

Update = Callable[[common_pb2.NodeStatus], clustermgr_pb2.UpdateReply]


@dataclass
class StreamLimits:
    """Limits of one ClusterMgr's heartbeat streams."""

    #: The server ends a stream (OK) after this long, at a message boundary.
    max_age_s: float = HEARTBEAT_STREAM_MAX_AGE_S


async def serve(
    update: Update,
    requests: AsyncIterator[common_pb2.NodeStatus],
    context: grpc.aio.ServicerContext,
    limits: StreamLimits,
) -> AsyncIterator[clustermgr_pb2.HeartbeatReply]:
    """Answer every status of requests with update(status), in order, until
    the client half-closes, the stream reaches its maximum age, or a status
    fails validation (INVALID_ARGUMENT). Exceptions never escape as a
    traceback to the client: the stream ends with a short status."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + limits.max_age_s
    latency = RPC_LATENCY.labels(METHOD)
    HEARTBEAT_STREAMS.inc()
    try:
        it = aiter(requests)
        while True:
            try:
                status = await anext(it)
            except StopAsyncIteration:
                return  # the client half-closed: end with OK
            except DecodeError:
                RPC_REQUESTS.labels(METHOD, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "status: the bytes do not decode as a NodeStatus",
                )
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
            yield clustermgr_pb2.HeartbeatReply(node_id=status.node_id, reply=reply)
            if loop.time() >= ends:
                return
    finally:
        HEARTBEAT_STREAMS.dec()
