"""Disaggregated serving on the emulated LLM server: one binary, two roles.

A prefill instance answers ``POST /v1/pd/prefill``: a completion body plus
``galaxy_decode`` (the decode instance: ``http://HOST:PORT`` or, on the same
node, ``unix:/path`` or ``unix:@name``) and optionally
``galaxy_decode_lease`` (the decode's lease token, for a node's entry) and
``galaxy_decode_instance`` (its id, for a node's KV relay). It
runs the prompt's prefill (to the first token), sends the KV cache to the
decode instance (``kvsend``: the bytes really move) and answers ``{kv_id,
kv_bytes, prompt_tokens, prefill_s, transfer_s}``. A decode instance
receives caches on ``PUT /v1/kv/ID`` and continues a completion whose body
names ``galaxy_kv_id``: no prefill there (the engine counts the cache's
tokens as present), so its first token comes after one decode step;
``galaxy_prefill_instance`` in that body comes back in ``usage``.

The emulated cache is ``prompt tokens x kv_bytes_per_token / kv_scale``
bytes: ``--kv-scale`` shrinks a large model's cache (LLaMA-2-13B: 8.19 GB at
10k tokens) to what this machine can move, and the report says by how much.
Who picks the pair is ``controlplane.runtime.disagg.PairPicker``'s business
(in Dispatch), not this module's.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from controlplane.llm import kvsend, kvwire
from controlplane.llm.engine import QueueFull, Request
from controlplane.llm.errors import BadRequest

if TYPE_CHECKING:  # at run time the server imports this module, not the reverse
    from controlplane.llm.server import LlmServer


class Disaggregation:
    """The prefill and decode routes of one emulated server."""

    def __init__(self, server: LlmServer, inbox: kvwire.KvInbox, kv_scale: float = 1.0) -> None:
        if kv_scale < 1:
            raise ValueError("kv_scale: at least 1 (it divides the cache's bytes)")
        self.server, self.inbox, self.kv_scale = server, inbox, kv_scale
        server.on_parsed = self.import_kv

    def kv_bytes(self, prompt_tokens: int) -> int:
        """The emulated cache's size for a prompt (at least one byte)."""
        per = self.server.engine.profile.kv_bytes_per_token
        return max(1, int(prompt_tokens * per / self.kv_scale))

    def install(self, app: web.Application) -> None:
        """Add the routes to the server's application."""
        app.router.add_post("/v1/pd/prefill", self.prefill)
        app.router.add_put("/v1/kv/{kv_id}", kvwire.receiver(self.inbox))
        app.router.add_delete("/v1/kv/{kv_id}", kvwire.remover(self.inbox))

    def import_kv(self, body: dict[str, Any], req: Request) -> None:
        """A decode request: take its cache from the inbox (BadRequest naming
        ``galaxy_kv_id`` when it is not here)."""
        kv_id = body.get("galaxy_kv_id")
        if kv_id is None:
            return
        entry = kvwire.claim(self.inbox, kv_id)
        req.prompt_tokens = entry.tokens
        req.blocks = ()
        req.imported = True
        origin = body.get("galaxy_prefill_instance")
        if isinstance(origin, str):  # the gateway's note, echoed in usage
            req.prefilled_by = origin[: kvwire.MAX_ID * 2]

    async def prefill(self, request: web.Request) -> web.Response:
        """``POST /v1/pd/prefill``: see the module docstring."""
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise BadRequest("body: a JSON object")
            target, lease, instance = decode_target(body)
            req = self.server.parse(dict(body, max_tokens=1), chat="messages" in body)
        except (ValueError, BadRequest) as e:
            return _error(400, str(e)[:300])
        except RecursionError:
            return _error(400, "body: JSON nested too deeply")
        t0 = time.perf_counter()
        try:
            await self.server.complete_one(req)
        except QueueFull as e:
            return _error(429, f"engine queue full: {e}")
        except ValueError as e:
            return _error(400, str(e)[:300])
        prefill_s = time.perf_counter() - t0
        kv_id = uuid.uuid4().hex[:16]
        size = self.kv_bytes(req.prompt_tokens)
        try:
            moved_s = await kvsend.send(
                target, kv_id, size, req.prompt_tokens, lease=lease, instance=instance
            )
        except (RuntimeError, OSError, aiohttp.ClientError) as e:  # timeouts are OSErrors
            return _error(502, f"galaxy_decode: KV transfer failed: {str(e)[:200]}")
        return web.json_response({
            "kv_id": kv_id,
            "kv_bytes": size,
            "kv_scale": self.kv_scale,
            "prompt_tokens": req.prompt_tokens,
            "prefill_s": prefill_s,
            "transfer_s": moved_s,
        })  # fmt: skip


def decode_target(body: dict[str, Any]) -> tuple[str, str, str]:
    """A prefill request's ``galaxy_decode`` (where the cache goes),
    ``galaxy_decode_lease`` (its lease token, for a node's entry) and
    ``galaxy_decode_instance`` (its instance id, which a node's KV relay
    checks the lease against); BadRequest naming the field."""
    target = body.get("galaxy_decode")
    if not kvwire.valid_target(target):
        raise BadRequest(
            "galaxy_decode: the decode instance, http://HOST:PORT, unix:/path or unix:@name"
        )
    lease = body.get("galaxy_decode_lease", "")
    if not isinstance(lease, str) or len(lease) > 1024:
        raise BadRequest("galaxy_decode_lease: a lease token (a string, at most 1024 characters)")
    instance = body.get("galaxy_decode_instance", "")
    if not isinstance(instance, str) or (instance and not kvwire.valid_id(instance)):
        raise BadRequest("galaxy_decode_instance: an instance id (1-64 of A-Z, a-z, 0-9, '-', '_')")
    return str(target), lease, instance


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)
