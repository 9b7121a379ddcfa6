"""NodeAgent.InstanceStream: CreateInstance and DeleteInstance as messages
on one long-lived stream per caller process.

Every cold start costs a CreateInstance and, later, a DeleteInstance. On
grpc.aio a unary call costs the server about 460 us of CPU, a message on an
open stream about 200 us (docs/benchmarks.md), and the agent's own work per
start is a fraction of either. So Dispatch and Schedule keep one stream per
node agent (``controlplane.runtime.agent_streams``) and send each call as a
message. Every message is served by the unary handler's code
(``NodeAgentServicer.CreateInstance`` / ``DeleteInstance``) in a task of its
own, under its own deadline, and answered as soon as it is done, tagged with
the request's ``seq`` (a slow sandbox start holds up nothing behind it).

Bounded: at most ``MAX_IN_FLIGHT`` requests in flight per stream (one more
is answered RESOURCE_EXHAUSTED: the caller tries another node, as after a
full agent), and a caller that does not read its replies is held back
(reading stops, then HTTP/2 flow control). After ``MAX_AGE_S`` the stream
asks for a new one (goaway); at ``HARD_LIMIT_S`` it ends, withdrawing what
is still in flight (a withdrawn CreateInstance is like a cancelled unary
call: the start goes on, a retry with the same id joins it).

A message that breaks the stream's protocol (does not decode, seq <= 0, a
seq already in flight) ends the stream with INVALID_ARGUMENT and a message
naming the field. Each message is counted and timed under the unary
method's name (``NodeAgent/CreateInstance``...), as the interceptor counts
unary calls, so dashboards see the same figures whichever transport
carried them; open streams are in ``galaxy_nodeagent_instance_streams``.
Who may open the stream is decided as for the unary methods (an internal
method: components only, ``controlplane.runtime.authz``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Gauge

from controlplane.runtime import multiplex
from controlplane.runtime.agent_streams import MAX_IN_FLIGHT, MAX_TIMEOUT_MS
from controlplane.runtime.batches import batch_bytes
from galaxy.v1 import nodeagent_pb2

if TYPE_CHECKING:
    from controlplane.nodeagent.service import NodeAgentServicer

log = logging.getLogger(__name__)

#: The per-message metric labels: the unary methods' (see rpc's interceptor).
CREATE = "NodeAgent/CreateInstance"
DELETE = "NodeAgent/DeleteInstance"
#: After this long the caller is asked to move to a new stream.
MAX_AGE_S = 30.0
#: A request's deadline when the message names none (the longest allowed,
#: and the requests one stream may have in flight: MAX_TIMEOUT_MS and
#: MAX_IN_FLIGHT, shared with the callers).
DEFAULT_TIMEOUT_S = 60.0
#: The stream ends here at the latest (what is in flight is withdrawn):
#: long enough for a request sent just before the goaway to finish.
HARD_LIMIT_S = MAX_AGE_S + MAX_TIMEOUT_MS / 1000.0 + 5.0

STREAMS_OPEN = Gauge(
    "galaxy_nodeagent_instance_streams", "NodeAgent.InstanceStream calls open on this agent"
)
multiplex.timed(CREATE, DELETE)


def check(msg: nodeagent_pb2.InstanceStreamRequest) -> str | None:
    """What is wrong with one message, naming the field (None: nothing).
    The operation's own fields are the unary handler's to check."""
    if msg.WhichOneof("op") is None:
        return "op: one of create, delete is required"
    if msg.timeout_ms > MAX_TIMEOUT_MS:
        return f"timeout_ms: at most {MAX_TIMEOUT_MS}, got {msg.timeout_ms}"
    return None


class _Stream(multiplex.ServerStream[nodeagent_pb2.InstanceStreamReply]):
    """The state of one open stream (see module docstring)."""

    name = "InstanceStream"
    log = log
    unhandled = "unhandled error in %s (InstanceStream)"

    def __init__(self, servicer: NodeAgentServicer, context: grpc.aio.ServicerContext) -> None:
        pool = servicer.pool
        batches = pool is None or pool.config.stream_batches
        super().__init__(context, nodeagent_pb2.InstanceStreamReply, MAX_IN_FLIGHT, batches)
        if pool is not None:
            self.max_batch_bytes = batch_bytes(pool.config.max_message_bytes)
        self.servicer = servicer

    def accept(self, msg: Any) -> multiplex.Fatal | None:
        """A task per request; the stream ends on a broken protocol."""
        fatal = self.undecodable(msg) or self.check_new_seq(msg.seq)
        if fatal is not None:
            return fatal
        seq = msg.seq
        if self.admit(seq, check(msg), "try another node"):
            timeout = msg.timeout_ms / 1000.0 if msg.timeout_ms else DEFAULT_TIMEOUT_S
            due = self.loop.time() + timeout
            method = CREATE if msg.WhichOneof("op") == "create" else DELETE
            self.calls[seq] = self.loop.create_task(self.answer(seq, method, msg, due, method))
        return None

    async def call(
        self, seq: int, method: str, msg: Any, sent: multiplex.Sent | None
    ) -> nodeagent_pb2.InstanceStreamReply:
        """One request, through the unary handler's code."""
        if method is CREATE:
            created = await self.servicer.CreateInstance(msg.create, self.context)
            return nodeagent_pb2.InstanceStreamReply(seq=seq, created=created)
        deleted = await self.servicer.DeleteInstance(msg.delete, self.context)
        return nodeagent_pb2.InstanceStreamReply(seq=seq, deleted=deleted)


def serve(
    servicer: NodeAgentServicer,
    requests: AsyncIterator[nodeagent_pb2.InstanceStreamRequest],
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[nodeagent_pb2.InstanceStreamReply]:
    """The InstanceStream's replies (``NodeAgentServicer.InstanceStream``
    iterates them). What is in flight when it ends is withdrawn (a start
    goes on, as after a cancelled call)."""
    stream = _Stream(servicer, context)
    return stream.replies(requests, MAX_AGE_S, HARD_LIMIT_S, STREAMS_OPEN)
