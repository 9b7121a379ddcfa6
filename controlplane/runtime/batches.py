"""Batches on the multiplexed streams (``controlplane.runtime.multiplex``:
``Dispatch.DispatchStream``, ``NodeAgent.InstanceStream``).

A write on grpc.aio costs its caller ~0.15 ms of CPU whatever the message's
size, and under load messages queue behind it. So each side sends what
queued while its previous write was in flight as one message: the first,
with the others in its ``more`` field, handled in order as if each had come
alone. Nothing waits to fill a batch (light load sends one message per
write, as before). Both sides opt in: a caller that reads batched replies
says so in its request metadata (``galaxy-batch: 1``), a server that reads
batched requests in its response metadata. A batch holds at most
``MAX_BATCH`` messages and ``MAX_BATCH_BYTES`` bytes (a bigger message goes
alone), and nests no further.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

#: Metadata by which each side says it reads batched messages (``more``).
BATCH_KEY = "galaxy-batch"
BATCH_ON = (BATCH_KEY, "1")
#: The most messages one batch carries (the first and its ``more``).
MAX_BATCH = 256
#: The most bytes a batch's messages add up to, and never more than half
#: the process's message size limit (``batch_bytes``): a batch must never
#: be refused for its size.
MAX_BATCH_BYTES = 64 * 1024

BATCHED = Counter(
    "galaxy_stream_batched_messages_total",
    "Stream messages sent inside another's batch (more), by stream and side: each saved a write",
    ["stream", "side"],
)


def batch_bytes(max_message_bytes: int) -> int:
    """The byte bound of a batch under a message size limit."""
    return min(MAX_BATCH_BYTES, max_message_bytes // 2)


def problem(msg: Any) -> str | None:
    """What is wrong with a received batch, naming the field (None: it is
    well formed, or no batch)."""
    more = msg.more
    if not more:
        return None
    if len(more) >= MAX_BATCH:
        return f"more: at most {MAX_BATCH - 1} messages, got {len(more)}"
    for i, m in enumerate(more):
        if m.more:
            return f"more[{i}].more: must be empty"
    return None


def items(msg: Any) -> list[Any] | tuple[Any]:
    """The messages a received batch stands for: itself, then its ``more``."""
    return [msg, *msg.more] if msg.more else (msg,)


def batching(metadata: Any) -> bool:
    """Whether metadata (request or response) says its sender reads batches."""
    return any(k == BATCH_KEY and v == "1" for k, v in metadata or ())
