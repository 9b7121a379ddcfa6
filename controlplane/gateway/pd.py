"""Disaggregated LLM requests in the gateway: prefill on one instance, decode
on another, the KV cache moved between them.

When Dispatch grants a decode instance of a disaggregated function
(``InstanceAddr.pd`` names its prefill function), the gateway, before it
sends the request there:

1. asks the prefill function's owner for a prefill instance paired with the
   decode instance's node (``RoutingHint.decode_node``; the owner chooses
   by queue and transfer cost, ``functions/dispatch/pdpair.py``);
2. calls it: ``POST /v1/pd/prefill`` with the request's body plus
   ``galaxy_decode``, the decode instance's KV inbox: shared memory passed
   over its abstract Unix socket when both run on one node, else its
   address (with its lease token for a node's entry, and its instance id,
   ``galaxy_decode_instance``, which a node's KV relay checks the token
   against). The prefill instance runs the prompt and sends the cache there
   itself (from a bubblewrap sandbox through its node agent's KV relay,
   ``controlplane/nodeagent/entry/kvrelay.py``), so the bytes take the path
   between the two nodes and never pass through the gateway; it answers the
   cache's id;
3. releases the prefill slot and sends the decode instance the body with
   ``galaxy_kv_id`` (continue from that cache) and
   ``galaxy_prefill_instance`` (reported back in ``usage``).

Why the gateway orchestrates rather than the decode instance: the gateway
already holds the request, the caller's token (the prefill function is
dispatched with it, so authorization is Dispatch's as for any call) and the
SDK's Dispatch client; an instance would need Dispatch credentials and
egress to the control plane. Why not relay the bytes: a cache is MBs to GBs
and the pairing's point is the link between the two instances.

Any failure falls back to aggregated serving, never to an error: no prefill
instance granted, the prefill call failing or refused, the KV transfer
failing (the prefill instance answers 502 naming ``galaxy_decode``). The
decode instance then prefills itself; ``galaxy_gateway_pd_total`` counts
each outcome and the log line says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from prometheus_client import Counter

from controlplane.runtime import kvaddr
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.llmprompt import chat_words
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import dispatch_pb2

log = logging.getLogger(__name__)

PD = Counter(
    "galaxy_gateway_pd_total",
    "Disaggregated LLM requests by outcome: disaggregated, or the fallback to "
    "aggregated decode and its cause",
    ["outcome"],
)
OUTCOMES = ("disaggregated", "fallback_body", "fallback_dispatch", "fallback_prefill",
            "fallback_transfer")  # fmt: skip
for _o in OUTCOMES:
    PD.labels(_o)
#: the prefill instance's answer is a small JSON object
MAX_ANSWER = 64 * 1024


def prompt_tokens(doc: dict[str, Any]) -> int:
    """The prompt's length as the routing hint counts it (words; a replayed
    trace's ``galaxy_prompt_tokens``), 0 when unreadable."""
    given = doc.get("galaxy_prompt_tokens")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return min(given, 2**31)
    msgs = doc.get("messages")
    if isinstance(msgs, list):
        words = chat_words(msgs)
        return 0 if isinstance(words, int) else len(words)
    prompt = doc.get("prompt")
    return len(prompt.split()) if isinstance(prompt, str) else 0


def kv_target(decode: dispatch_pb2.InstanceAddr, prefill: dispatch_pb2.InstanceAddr) -> str:
    """Where the prefill instance sends the cache: on the same node, shared
    memory handed over the decode instance's abstract Unix socket (no byte
    crosses a socket: 12-31% less CPU per move than HTTP over the Unix
    socket, docs/llm.md); else its address over TCP."""
    if prefill.node_id and prefill.node_id == decode.node_id:
        return kvaddr.shm_target(decode.instance_id)
    return f"http://{decode.address}"


#: (the granted instance, the body, seconds left) -> the body to send it
Prepare = Callable[[dispatch_pb2.InstanceAddr, bytes | bytearray, float],
                   Awaitable[bytes | bytearray]]  # fmt: skip


class Disaggregation:
    """The prefill step of disaggregated requests (see the module docstring)."""

    def __init__(self, client: GalaxyClient) -> None:
        self.client = client

    def prepare(self, token: str | None) -> Prepare:
        """The slot cache's ``prepare`` for one caller's request."""

        async def prepare(
            addr: dispatch_pb2.InstanceAddr, data: bytes | bytearray, limit_s: float
        ) -> bytes | bytearray:
            return await self.prefilled(addr, data, token, limit_s)

        return prepare

    async def prefilled(
        self,
        decode: dispatch_pb2.InstanceAddr,
        data: bytes | bytearray,
        token: str | None,
        limit_s: float,
    ) -> bytes | bytearray:
        """The body to send to ``decode``: ``data`` itself unless its function
        is disaggregated and the prefill succeeded, then with ``galaxy_kv_id``."""
        if not decode.pd.prefill:
            return data
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):  # the decode instance answers the error
            return self._fallback("fallback_body", decode, "body: not a JSON object", data)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        hint = dispatch_pb2.RoutingHint(
            decode_node=decode.node_id, prompt_tokens=prompt_tokens(doc), pd=decode.pd
        )
        try:
            prefill = await self.client.dispatch(
                decode.pd.prefill, deadline_s=max(limit_s, 0.001), token=token, hint=hint
            )
        except GalaxyError as e:
            return self._fallback("fallback_dispatch", decode, e.message, data)
        try:
            outcome, said = await self._prefill(decode, prefill, doc, deadline - loop.time())
        finally:
            await self.client.release(prefill, defer=True)
        if outcome != "disaggregated":
            return self._fallback(outcome, decode, said, data)
        PD.labels(outcome).inc()
        body = dict(doc, galaxy_kv_id=said, galaxy_prefill_instance=prefill.instance_id)
        return json.dumps(body).encode()

    async def _prefill(
        self,
        decode: dispatch_pb2.InstanceAddr,
        prefill: dispatch_pb2.InstanceAddr,
        doc: dict[str, Any],
        limit_s: float,
    ) -> tuple[str, str]:
        """Call the prefill instance: ("disaggregated", kv id) or (the
        fallback's outcome, why)."""
        ask = dict(doc, galaxy_decode=kv_target(decode, prefill),
                   galaxy_decode_lease=decode.lease_token,
                   galaxy_decode_instance=decode.instance_id, stream=False)  # fmt: skip
        body = json.dumps(ask).encode()
        headers = {"Content-Type": "application/json"}
        try:
            async with self.client.http.open(
                prefill.address, "/v1/pd/prefill", body, max(limit_s, 0.001), "POST", headers,
                prefill.lease_token,
            ) as resp:  # fmt: skip
                status = resp.status
                answer = await resp.content.read(MAX_ANSWER)
        except (GalaxyError, aiohttp.ClientError, OSError) as e:  # timeouts are OSErrors
            return "fallback_prefill", f"prefill instance {prefill.instance_id}: {e}"[:300]
        try:
            got = json.loads(answer)
        except ValueError:
            got = None
        if status == 200 and isinstance(got, dict) and kvaddr.valid_id(str(got.get("kv_id"))):
            return "disaggregated", str(got["kv_id"])
        why = ""
        if isinstance(got, dict) and isinstance(got.get("error"), dict):
            why = str(got["error"].get("message", ""))
        # 502 is the prefill instance's word for a KV transfer that failed
        outcome = "fallback_transfer" if status == 502 else "fallback_prefill"
        return outcome, f"prefill instance {prefill.instance_id}: HTTP {status} {why}"[:300]

    @staticmethod
    def _fallback(
        outcome: str, decode: dispatch_pb2.InstanceAddr, why: str, data: bytes | bytearray
    ) -> bytes | bytearray:
        PD.labels(outcome).inc()
        log.warning(
            "%s: aggregated decode on %s (%s): %s",
            decode.function, decode.instance_id, outcome, why[:300],
        )  # fmt: skip
        return data
