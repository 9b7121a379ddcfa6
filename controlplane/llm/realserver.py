"""The real model (llama.cpp through llama-cpp-python) as a Galaxy LLM
runtime that can prefill for another instance, decode from another
instance's state, and sleep.

    python -m controlplane.llm.realserver --model gemma-3-270m-q4_k_m.gguf

Routes (JSON; errors name the field, OpenAI's error shape):

- ``POST /v1/completions`` ``{prompt, max_tokens, temperature, seed}``; with
  ``galaxy_kv_id`` the prompt's state comes from a prefill instance (received
  on ``PUT /v1/kv/ID``, kvwire's protocol) instead of being evaluated here.
  ``usage.galaxy_evaluated_prompt_tokens`` says how much of the prompt ran
  here, ``galaxy_woke_s`` how long waking took (0 when awake).
- ``POST /v1/pd/prefill`` ``{prompt, galaxy_decode}``: evaluate the prompt,
  export its state (realkv) and PUT it to the decode instance
  (``http://HOST:PORT`` or ``unix:/path``); answers ``{kv_id, kv_bytes,
  prompt_tokens, prefill_s, transfer_s}``.
- ``POST /v1/galaxy/sleep``: release the context, keep the weights (realhost);
  any request wakes the instance, or ``POST /v1/galaxy/wake`` ahead of one;
  ``GET /v1/galaxy/state`` tells which, and for how long (``asleep_s``).

No streaming and no chat route (llama-cpp-python's own server, runtime
``llama-cpp``, has both). One request runs at a time (llama.cpp's context is not shared), so the
runtime's concurrency is 1, like llama-cpp-python's own server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
from aiohttp import web

from controlplane.llm import kvsend, kvwire, realkv
from controlplane.llm.errors import BadRequest
from controlplane.llm.pdroutes import decode_target
from controlplane.llm.realhost import ModelHost

MAX_TOKENS = 512
MAX_BODY = 1 << 20


class RealServer:
    """The routes over one ModelHost."""

    def __init__(self, host: ModelHost, model_id: str, inbox: kvwire.KvInbox) -> None:
        self.host, self.model_id, self.inbox = host, model_id, inbox
        # One worker: llama.cpp calls never overlap, and never block the loop.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="llama")

    def app(self) -> web.Application:
        """The aiohttp application (a KV cache can exceed aiohttp's body limit:
        the kv route streams, JSON routes read at most MAX_BODY)."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/pd/prefill", self.prefill)
        app.router.add_put("/v1/kv/{kv_id}", kvwire.receiver(self.inbox))
        app.router.add_delete("/v1/kv/{kv_id}", kvwire.remover(self.inbox))
        app.router.add_post("/v1/galaxy/sleep", self.sleep)
        app.router.add_post("/v1/galaxy/wake", self.wake)
        app.router.add_get("/v1/galaxy/state", self.state)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        self._pool.shutdown(wait=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def health(self, _r: web.Request) -> web.Response:
        """Liveness (an asleep instance is healthy: it wakes on demand)."""
        return web.json_response({"ok": True})

    async def models(self, _r: web.Request) -> web.Response:
        """OpenAI's model list: the one model served."""
        return web.json_response(
            {"object": "list", "data": [{"id": self.model_id, "object": "model"}]}
        )

    async def state(self, _r: web.Request) -> web.Response:
        """Awake or asleep (and for how long), and how often it has slept."""
        h = self.host
        return web.json_response({"asleep": h.asleep, "sleeps": h.sleeps, "asleep_s": h.asleep_s})

    async def sleep(self, _r: web.Request) -> web.Response:
        """Release the context (waits for a running request to finish)."""
        slept = await self._run(self.host.sleep)
        return web.json_response({"asleep": True, "changed": slept})

    async def wake(self, _r: web.Request) -> web.Response:
        """Build the context now (a scale-out wakes an instance ahead of the
        requests it routes there, so none of them waits for it)."""
        woke_s = await self._run(self.host.wake)
        return web.json_response({"asleep": False, "woke_s": woke_s})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError):
            raise BadRequest("body: a JSON object") from None
        except web.HTTPRequestEntityTooLarge:
            raise BadRequest(f"body: at most {MAX_BODY} bytes") from None
        if not isinstance(body, dict):
            raise BadRequest("body: a JSON object")
        return body

    def _prompt(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt: a non-empty string")
        tokens = self.host.tokenize(prompt)
        if len(tokens) >= self.host.n_ctx:
            raise BadRequest(f"prompt: {len(tokens)} tokens, the context holds {self.host.n_ctx}")
        return tokens

    async def completions(self, request: web.Request) -> web.Response:
        """``POST /v1/completions`` (see the module docstring)."""
        try:
            body = await self._body(request)
            if body.get("stream"):
                raise BadRequest("stream: not served here (one JSON answer per request)")
            tokens = self._prompt(body)
            max_tokens = _int(body, "max_tokens", 16, 1, MAX_TOKENS)
            seed = _int(body, "seed", 0, 0, 2**31 - 1)
            temperature = body.get("temperature", 0.0)
            if isinstance(temperature, bool) or not isinstance(temperature, int | float):
                raise BadRequest("temperature: a number")
            if not 0 <= temperature <= 2:
                raise BadRequest("temperature: between 0 and 2")
            state = self._take_state(body.get("galaxy_kv_id"))
            out = await self._run(
                self.host.complete, tokens, max_tokens, float(temperature), seed, state
            )
        except (BadRequest, realkv.BadState) as e:
            return _error(400, str(e)[:300])
        return web.json_response({
            "id": "cmpl-" + uuid.uuid4().hex[:12],
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason}],
            "usage": {
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "total_tokens": out.prompt_tokens + out.completion_tokens,
                "galaxy_evaluated_prompt_tokens": out.evaluated_prompt_tokens,
                "galaxy_woke_s": out.woke_s,
                **_origin(body),
            },
        })  # fmt: skip

    def _take_state(self, kv_id: Any) -> bytearray | mmap.mmap | None:
        return None if kv_id is None else kvwire.claim(self.inbox, kv_id).data

    async def prefill(self, request: web.Request) -> web.Response:
        """``POST /v1/pd/prefill`` (see the module docstring)."""
        try:
            body = await self._body(request)
            target, lease, instance = decode_target(body)
            tokens = self._prompt(body)
        except BadRequest as e:
            return _error(400, str(e)[:300])
        t0 = time.perf_counter()
        exported, woke = await self._run(self.host.prefill, tokens)
        prefill_s = time.perf_counter() - t0
        kv_id = uuid.uuid4().hex[:16]
        size = len(exported.data)
        try:
            moved_s = await kvsend.send(
                target, kv_id, size, exported.tokens, data=exported.data, lease=lease,
                instance=instance,
            )  # fmt: skip
        except (RuntimeError, OSError, aiohttp.ClientError) as e:  # timeouts are OSErrors
            return _error(502, f"galaxy_decode: KV transfer failed: {str(e)[:200]}")
        return web.json_response({
            "kv_id": kv_id, "kv_bytes": size, "prompt_tokens": exported.tokens,
            "prefill_s": prefill_s, "transfer_s": moved_s, "woke_s": woke,
        })  # fmt: skip


def _origin(body: dict[str, Any]) -> dict[str, str]:
    """``galaxy_prefill_instance`` of a decode from a moved state (the
    gateway's note of where its prompt ran), for usage."""
    origin = body.get("galaxy_prefill_instance")
    if body.get("galaxy_kv_id") is None or not isinstance(origin, str):
        return {}
    return {"galaxy_prefill_instance": origin[:128]}


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(f"{name}: an integer from {lo} to {hi}")
    return v


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "code": status}},
        status=status,
    )


async def serve(a: argparse.Namespace, host: str, port: int) -> None:
    """Load the model, then serve until cancelled."""
    model = ModelHost(a.model, n_ctx=a.n_ctx, n_threads=a.n_threads, seed=a.seed)
    server = RealServer(model, a.model_alias, kvwire.KvInbox(a.kv_inbox_mb << 20))
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    # Same-node KV transfers skip the TCP stack.
    instance = os.environ.get("GALAXY_INSTANCE_ID", "")
    stop = await kvwire.listen_local(runner, a.kv_unix, instance, server.inbox)
    try:
        await asyncio.Event().wait()
    finally:
        stop()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Command line (the node agent sets $HOST and $PORT)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the GGUF file")
    p.add_argument("--model_alias", default=os.environ.get("GALAXY_FUNCTION", "model"))
    p.add_argument("--n_ctx", type=int, default=2048)
    p.add_argument("--n_threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-inbox-mb", type=int, default=256,
                   help="room for KV states received from prefill instances")  # fmt: skip
    p.add_argument("--kv-unix", default=os.environ.get("GALAXY_KV_UNIX", ""),
                   help="also listen on this Unix socket (same-node KV transfers)")  # fmt: skip
    a = p.parse_args(argv)
    if not 16 <= a.n_ctx <= 131072 or not 1 <= a.n_threads <= 64 or a.kv_inbox_mb < 0:
        p.error("--n_ctx 16..131072, --n_threads 1..64, --kv-inbox-mb >= 0")
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    try:
        asyncio.run(serve(a, host, port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
