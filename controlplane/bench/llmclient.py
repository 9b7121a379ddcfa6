"""The LLM bench's open-loop load generator: streaming chat completions sent
on a schedule (each at its own time, whatever the earlier ones are doing),
recording the arrival time of every content chunk.

Speaks the OpenAI wire protocol over aiohttp (Server-Sent Events), asking for
``usage`` in the last chunk (``stream_options.include_usage``), so token
counts are the server's. A prompt is sent either as a token count the
emulated server reads (``galaxy_prompt_tokens``) or as text of about that
many tokens (one common word per token) for a real model.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from controlplane.bench.llmmetrics import Record
from controlplane.bench.llmtrace import LlmRequest

#: Bound on one request (a stream that stalls longer is an error).
REQUEST_TIMEOUT_S = 300.0
#: Bound on requests in flight: an overloaded server makes later requests
#: errors instead of unbounded memory in the load generator.
MAX_IN_FLIGHT = 2048
#: Words a text prompt repeats (one token each in common tokenizers).
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran")


@dataclass(frozen=True)
class Target:
    """Where and how to send: the gateway's /v1 base URL, the function
    (the body's ``model``), a bearer token, and the prompt form."""

    base_url: str
    model: str
    token: str = ""
    prompt: str = "tokens"  # "tokens" (emulated server) or "text" (a real model)


def text_prompt(n: int) -> str:
    """A text prompt of about ``n`` tokens (n common words)."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n))


def body(t: Target, r: LlmRequest) -> dict[str, object]:
    """The chat completion request for one trace row."""
    b: dict[str, object] = {
        "model": t.model,
        "max_tokens": r.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if t.prompt == "tokens":
        b["messages"] = [{"role": "user", "content": "bench"}]
        b["galaxy_prompt_tokens"] = r.prompt_tokens
        # The Azure trace has no prompt contents: no prefix blocks to share.
        b["galaxy_prefix_blocks"] = list(r.prefix_blocks)
    else:
        b["messages"] = [{"role": "user", "content": r.text or text_prompt(r.prompt_tokens)}]
    return b


async def one(s: aiohttp.ClientSession, t: Target, r: LlmRequest, rec: Record) -> None:
    """Send one request and fill ``rec`` as its chunks arrive."""
    headers = {"Authorization": f"Bearer {t.token}"} if t.token else {}
    url = t.base_url.rstrip("/") + "/chat/completions"
    try:
        async with s.post(url, json=body(t, r), headers=headers) as resp:
            if resp.status != 200:
                rec.error = f"http {resp.status}"
                await resp.read()
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.monotonic()
                chunk = json.loads(data)
                for c in chunk.get("choices") or ():
                    if (c.get("delta") or {}).get("content"):
                        rec.chunks.append(now)
                u = chunk.get("usage")
                if u:
                    rec.prompt_tokens = int(u.get("prompt_tokens") or 0)
                    rec.output_tokens = int(u.get("completion_tokens") or 0)
            rec.done = time.monotonic()
            if not rec.chunks:
                rec.error = "no tokens"
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError) as e:
        rec.error = type(e).__name__


async def run(t: Target, schedule: Sequence[LlmRequest]) -> tuple[list[Record], float]:
    """Send the schedule open loop; returns the records and the wall time
    from the first send to the last answer."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    conn = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    records: list[Record] = []
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as s:
        start = time.monotonic()
        tasks = []
        for r in schedule:
            delay = start + r.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = Record(sent=time.monotonic(), prompt_tokens=r.prompt_tokens)
            records.append(rec)
            if gate.locked():
                rec.error = "load generator full"
                continue
            tasks.append(asyncio.create_task(_gated(gate, s, t, r, rec)))
        await asyncio.gather(*tasks)
        ends = [r.done for r in records if r.ok]
        wall = (max(ends) if ends else time.monotonic()) - start
    return records, wall


async def _gated(
    gate: asyncio.Semaphore, s: aiohttp.ClientSession, t: Target, r: LlmRequest, rec: Record
) -> None:
    async with gate:
        await one(s, t, r, rec)
