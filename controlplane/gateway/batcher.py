"""The gateway performing adaptive batching (``batching.BatchPolicy``
decides, ``batchcodec`` merges and splits): concurrent KServe v1 ``:predict``
and v2 ``/infer`` requests to a function whose spec sets ``batching`` are
sent as one call through the slot cache, and each caller gets its own rows.

Why the gateway: every request passes through it already with its body
read, and it holds the slots, so it sees when a function is busy. The node
agent's per-node entry would see only its node's share of the requests (a
smaller batch at the same load); the policy and codec are pure, so they can
move there unchanged once that entry exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from controlplane.gateway import batchcodec, guard
from controlplane.gateway.batching import BatchPolicy
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.slots import SlotCache
from controlplane.runtime.errors import GalaxyError, ResourceExhausted
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2

log = logging.getLogger(__name__)

#: How long the gateway trusts a function's batching setting (seconds): a
#: redeploy that turns batching on or off takes effect within this.
SPEC_TTL_S = 5.0
#: The longest a request waits for its function's setting (seconds).
SPEC_TIMEOUT_S = 2.0
#: Functions whose setting is remembered at most (oldest forgotten first).
MAX_SPECS = 4096

#: (function, path, tag, token, the parts' merge key)
Key = tuple[str, str, str, str | None, tuple[Any, ...]]
#: what a caller gets: status, body, content type
Answer = tuple[int, bytes, str]
#: Answer header: ``{batch id}/{requests in the batch}``.
BATCH_HEADER = "X-Galaxy-Batch"


@dataclass(eq=False)
class _Queue:
    policy: BatchPolicy
    waiting: list[tuple[batchcodec.Part, asyncio.Future[tuple[int, bytes, str, str]]]] = field(
        default_factory=list
    )
    timer: asyncio.TimerHandle | None = None


class Batcher:
    """Batches by function for one gateway."""

    def __init__(
        self,
        client: GalaxyClient,
        slots: SlotCache,
        cfg: GatewayConfig,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.slots = slots
        self.cfg = cfg
        self.clock = clock
        self._queues: dict[Key, _Queue] = {}
        self._specs: dict[str, tuple[float, common_pb2.BatchingSpec | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._batches = 0

    def _now(self) -> float:
        return self.clock() if self.clock else asyncio.get_running_loop().time()

    async def setting(self, function: str) -> common_pb2.BatchingSpec | None:
        """The function's batching setting (None: not batched), cached for
        SPEC_TTL_S; a function the gateway cannot read is not batched."""
        now = self._now()
        hit = self._specs.get(function)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            # Bounded apart from the request's deadline: a slow control plane
            # turns batching off for a while, it does not hold requests.
            async with asyncio.timeout(SPEC_TIMEOUT_S):
                spec = await self.client.get_function(function)
            found = spec.batching if spec.HasField("batching") else None
        except (GalaxyError, TimeoutError) as e:
            log.debug("batching off for %s: %s", function, e)
            found = None
        if len(self._specs) >= MAX_SPECS:
            self._specs.pop(next(iter(self._specs)))
        self._specs[function] = (now + SPEC_TTL_S, found)
        return found

    async def maybe(
        self,
        kind: str,
        function: str,
        path: str,
        read: Callable[[], Awaitable[bytes | bytearray]],
        tag: str,
        token: str | None,
    ) -> web.Response | None:
        """The answer of a routed POST from a batch, when its function is
        batched and it is a plain v1 :predict or v2 /infer request; None
        when it is to be sent alone."""
        bare = path.split("?", 1)[0]
        if kind == "oip-v2" and not bare.endswith("/infer"):
            return None
        if kind == "kserve-v1" and not bare.endswith(":predict"):
            return None  # :explain answers are not rows to split
        if kind not in ("kserve-v1", "oip-v2"):
            return None
        setting = await self.setting(function)
        if setting is None:
            return None
        try:
            doc = guard.parse_json(await read())
        except guard.BadJson:
            return None  # the function answers it (its own error)
        protocol = "v1" if kind == "kserve-v1" else "v2"
        return await self.submit(setting, function, path, protocol, doc, tag, token)

    async def submit(
        self,
        setting: common_pb2.BatchingSpec,
        function: str,
        path: str,
        protocol: str,
        doc: Any,
        tag: str,
        token: str | None,
    ) -> web.Response | None:
        """This caller's answer from a batch; None when the request cannot
        join one (the caller sends it alone)."""
        try:
            p = batchcodec.part(protocol, doc)
        except batchcodec.Unbatchable:
            return None
        key: Key = (function, path, tag, token, p.key)
        q = self._queues.get(key)
        if q is None:
            policy = BatchPolicy(
                setting.max_batch_size,
                setting.max_latency_ms / 1000.0,
                self.cfg.batch_parallel,
                self.cfg.batch_max_queue,
            )
            q = self._queues[key] = _Queue(policy)
        if not q.policy.admit(p.rows, self._now()):
            raise ResourceExhausted(
                f"batching: {len(q.waiting)} requests to {function} wait for a batch already; retry"
            )
        fut: asyncio.Future[tuple[int, bytes, str, str]] = (
            asyncio.get_running_loop().create_future()
        )
        q.waiting.append((p, fut))
        self._pump(key, q)
        status, body, ctype, batch = await fut
        # Which batch served it (callers of one batch share the id), and how
        # many requests it merged: what a client or a test can check.
        return web.Response(
            status=status, body=body, content_type=ctype, headers={BATCH_HEADER: batch}
        )

    def _pump(self, key: Key, q: _Queue) -> None:
        """Do what the policy decides now: send batches, or set its timer."""
        if q.timer is not None:
            q.timer.cancel()
            q.timer = None
        while True:
            d = q.policy.decide(self._now())
            if d.send:
                batch = q.waiting[: d.send]
                del q.waiting[: d.send]
                q.policy.sent(d.send)
                t = asyncio.create_task(self._send(key, q, batch))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
                continue
            if d.wake_at is not None:
                loop = asyncio.get_running_loop()
                delay = max(d.wake_at - self._now(), 0.0)
                q.timer = loop.call_later(delay, self._pump, key, q)
            elif q.policy.in_flight == 0 and not q.waiting:
                self._queues.pop(key, None)
            return

    async def _send(
        self,
        key: Key,
        q: _Queue,
        batch: list[tuple[batchcodec.Part, asyncio.Future[tuple[int, bytes, str, str]]]],
    ) -> None:
        """One merged call; every caller of the batch gets its rows, or the
        same error."""
        function, path, tag, token, _ = key
        parts = [p for p, _ in batch]
        self._batches += 1
        tag_of_batch = f"{self._batches}/{len(batch)}"
        answers: list[Answer] | BaseException
        try:
            answers = await self._call(function, path, tag, token, parts)
        except (GalaxyError, asyncio.CancelledError) as e:
            answers = e
        finally:
            q.policy.returned()
        for i, (_, fut) in enumerate(batch):
            if fut.done():  # the caller went away
                continue
            if isinstance(answers, BaseException):
                fut.set_exception(answers)
            else:
                fut.set_result((*answers[i], tag_of_batch))
        self._pump(key, q)

    async def _call(
        self, function: str, path: str, tag: str, token: str | None, parts: list[batchcodec.Part]
    ) -> list[Answer]:
        data = orjson.dumps(batchcodec.merge(parts))

        async def body() -> bytes:
            return data

        headers = {"Content-Type": "application/json"}
        limit = self.cfg.max_body_bytes * max(len(parts), 1)
        async with self.slots.slot(function, path, body, headers, "POST", tag, token) as (
            slot,
            upstream,
        ):
            if upstream is None:  # an emulated sandbox answers nothing to split
                return [_error(502, "batching: an emulated instance answers no rows")] * len(parts)
            raw = bytearray()
            async for chunk in upstream.content.iter_any():
                raw += chunk
                if len(raw) > limit:
                    return [_error(502, "batching: the batch's answer is too large")] * len(parts)
            slot.reusable = True
            status, ctype = upstream.status, upstream.content_type
        if status != 200:
            # The function refused the batch: each caller sees its answer as is.
            return [(status, bytes(raw), ctype)] * len(parts)
        try:
            split = batchcodec.split(parts, guard.parse_json(raw))
        except (batchcodec.BadAnswer, guard.BadJson) as e:
            return [_error(502, f"batching: {e}")] * len(parts)
        return [(200, orjson.dumps(s), "application/json") for s in split]


def _error(status: int, message: str) -> Answer:
    body = {"error": {"message": message, "code": status, "type": "batching"}}
    return status, orjson.dumps(body), "application/json"
