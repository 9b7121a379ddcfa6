"""An emulated LLM server, OpenAI-compatible: ``/v1/chat/completions`` and
``/v1/completions`` (streaming or not, with ``usage``), ``/v1/models``,
``/health`` and ``/metrics`` with vLLM's metric names, and sleep
(``emusleep``: the real server's routes). Timing comes from the
emulated engine (``engine``): no model runs, nothing spins while waiting.

    python -m controlplane.llm.server --profile smollm2-135m-cpu   # $HOST:$PORT

Prompts are counted in whitespace-separated words. A request may instead
give ``galaxy_prompt_tokens`` and ``galaxy_prefix_blocks`` (a trace's input
length and block hash ids, e.g. the Mooncake trace's ``hash_ids``) so
replayed traces exercise the prefix cache as the real prompts did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.llm.emusleep import EmulatedSleep
from controlplane.llm.engine import Engine, QueueFull, Request, block_hashes
from controlplane.llm.errors import BadRequest
from controlplane.llm.profiles import profile
from controlplane.runtime.llmlatency import TPOT_BUCKETS, TTFT_BUCKETS
from controlplane.runtime.llmprompt import chat_words
from controlplane.runtime.llmsignals import digest

MAX_TOKENS = 4096
MAX_BODY = 4 * 1024 * 1024
LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


#: prefix-block digests exported on /metrics (a bound on the page's size)
PREFIX_BLOCKS_REPORTED = 256


class _EngineGauges(Collector):
    def __init__(self, engine: Engine, model: str) -> None:
        self.engine, self.model = engine, model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        e, labels = self.engine, [self.model]
        for name, doc, value in (
            ("vllm:num_requests_waiting", "Requests waiting to be admitted.", len(e.waiting)),
            ("vllm:num_requests_running", "Requests in the running batch.", len(e.running)),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage, 0-1 (emulated).", e.kv_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            yield g
        c = e.counters
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             c.prefix_queries),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", c.prefix_hits),
            ("vllm:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens),
            ("vllm:generation_tokens", "Tokens generated.", c.generation_tokens),
        ):  # fmt: skip
            g = GaugeMetricFamily(name + "_total", doc + " (a counter)", labels=["model_name"])
            g.add_metric(labels, value)
            yield g
        # The most recent prefix blocks, bounded: what a router's precise
        # prefix affinity reads (controlplane.runtime.llmsignals).
        g = GaugeMetricFamily(
            "galaxy:prefix_cache_block", "A cached prefix block (most recent).", labels=["block"]
        )
        recent = reversed(e.prefix)
        for h in digest(recent, PREFIX_BLOCKS_REPORTED, e.profile.prefix_cache_blocks):
            g.add_metric([h], 1.0)
        yield g


class LlmServer:
    """The HTTP side of one emulated engine."""

    def __init__(self, engine: Engine, model: str, clock: Any = time.monotonic) -> None:
        self.engine, self.model, self.clock = engine, model, clock
        self._work = asyncio.Event()
        self._waiters: dict[str, asyncio.Queue[int]] = {}
        self.registry = CollectorRegistry()
        self.registry.register(_EngineGauges(engine, model))
        # vLLM's names and bucket bounds: what Dispatch's autoscaler reads
        # (controlplane.runtime.llmlatency)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", ["model_name"],
                              buckets=TTFT_BUCKETS, registry=self.registry)  # fmt: skip
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "TPOT per request, the first token excluded.", ["model_name"],
                              buckets=TPOT_BUCKETS, registry=self.registry)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End to end.", ["model_name"],
                             buckets=LATENCY, registry=self.registry)  # fmt: skip
        self.refused = Counter("galaxy_llm_refused_total", "Requests refused (queue full).",
                               registry=self.registry)  # fmt: skip
        #: asleep or awake (``/v1/galaxy/sleep``); a request wakes it
        self.sleep = EmulatedSleep(engine)
        #: called with (body, request) before a completion is queued; may
        #: change the request or raise BadRequest (disaggregation's KV import)
        self.on_parsed: Callable[[dict[str, Any], Request], None] | None = None

    # -- the engine loop ------------------------------------------------------

    async def run(self) -> None:
        """Iterate the engine: sleep through each iteration, then deliver."""
        while True:
            step = self.engine.plan(self.clock())
            if step is None:
                self._work.clear()
                await self._work.wait()
                continue
            await asyncio.sleep(step.duration)
            for r in self.engine.complete(step):
                if r.generated == 1:  # TTFT when the first token is out, as vLLM
                    self.ttft.labels(self.model).observe(step.ends - r.arrived)
                q = self._waiters.get(r.id)
                if q is not None:
                    q.put_nowait(r.generated)

    # -- requests -------------------------------------------------------------

    def parse(self, body: dict[str, Any], chat: bool) -> Request:
        """The engine request of a completion body (BadRequest naming the field)."""
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("messages: a non-empty list of {role, content}")
            got = chat_words(msgs)
            if isinstance(got, int):
                raise BadRequest(
                    f"messages[{got}].content: a string or a list of {{type, text}} parts"
                )
            words = got
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise BadRequest("prompt: a string")
            words = prompt.split()
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise BadRequest("max_tokens: an integer")
        if not 1 <= max_tokens <= MAX_TOKENS:
            raise BadRequest(f"max_tokens: between 1 and {MAX_TOKENS}")
        n = body.get("galaxy_prompt_tokens")
        blocks = body.get("galaxy_prefix_blocks")
        if n is not None or blocks is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise BadRequest("galaxy_prompt_tokens: a positive integer")
            if not isinstance(blocks, list) or len(blocks) > 100_000:
                raise BadRequest("galaxy_prefix_blocks: a list of block ids")
            hashes = tuple(str(b) for b in blocks)
        else:
            n, hashes = max(1, len(words)), block_hashes(words, self.engine.profile.block_tokens)
        return Request(uuid.uuid4().hex[:12], n, max_tokens, hashes, arrived=self.clock())

    async def completions(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """POST /v1/chat/completions and /v1/completions."""
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise BadRequest("body: a JSON object")
            req = self.parse(body, chat)
            if self.on_parsed is not None:
                self.on_parsed(body, req)
            await self.sleep.awake()  # (counted in the request's TTFT)
            self.engine.submit(req)
        except (ValueError, BadRequest) as e:  # json errors are ValueErrors
            return _error(400, str(e)[:300])
        except RecursionError:  # JSON nested deeper than the parser goes
            return _error(400, "body: JSON nested too deeply")
        except QueueFull as e:
            self.refused.inc()
            return _error(429, f"engine queue full: {e}")
        with self._tracked(req) as q:
            if body.get("stream"):
                return await self._stream(request, req, q, chat, body)
            while (await q.get()) < req.max_tokens:
                pass
            return web.json_response(self._final(req, chat))

    @contextlib.contextmanager
    def _tracked(self, req: Request) -> Iterator[asyncio.Queue[int]]:
        """The queue of a queued request's token counts while it runs. On
        exit, a request that did not finish (its client went away) leaves
        the engine, and one that did is observed."""
        q: asyncio.Queue[int] = asyncio.Queue()
        self._waiters[req.id] = q
        self._work.set()
        try:
            yield q
        finally:
            self._waiters.pop(req.id, None)
            if req.finished_at is None:
                self.engine.cancel(req)
            else:
                self._observe(req)

    async def _stream(
        self, request: web.Request, req: Request, q: asyncio.Queue[int], chat: bool, body: Any
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})  # fmt: skip
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        while True:
            n = await q.get()
            done = n >= req.max_tokens
            text = f" tok{n}"
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if done else None}
            if chat:
                choice["delta"] = {"content": text} | ({"role": "assistant"} if n == 1 else {})
            else:
                choice["text"] = text
            await _sse(resp, {"id": req.id, "object": obj, "created": int(time.time()),
                              "model": self.model, "choices": [choice]})  # fmt: skip
            if done:
                break
        if isinstance(body.get("stream_options"), dict) and body["stream_options"].get(
            "include_usage"
        ):
            usage = {"id": req.id, "object": obj, "created": int(time.time()),
                     "model": self.model, "choices": [], "usage": _usage(req)}  # fmt: skip
            await _sse(resp, usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def complete_one(self, req: Request) -> None:
        """Queue req and wait until it finishes (QueueFull or ValueError from
        the engine when it cannot be queued)."""
        await self.sleep.awake()
        self.engine.submit(req)
        with self._tracked(req) as q:
            while (await q.get()) < req.max_tokens:
                pass

    def _final(self, req: Request, chat: bool) -> dict[str, Any]:
        text = "".join(f" tok{i}" for i in range(1, req.generated + 1)).strip()
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": req.id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": _usage(req),
        }

    def _observe(self, req: Request) -> None:
        assert req.first_token_at is not None and req.finished_at is not None
        self.e2e.labels(self.model).observe(req.finished_at - req.arrived)
        if req.generated > 1:
            per = (req.finished_at - req.first_token_at) / (req.generated - 1)
            self.tpot.labels(self.model).observe(per)

    # -- the app --------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application (routes above)."""
        app = web.Application(client_max_size=MAX_BODY)

        async def chat(r: web.Request) -> web.StreamResponse:
            return await self.completions(r, chat=True)

        async def plain(r: web.Request) -> web.StreamResponse:
            return await self.completions(r, chat=False)

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "galaxy-emulated"}]})  # fmt: skip

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry),
                                content_type="text/plain")  # fmt: skip

        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/completions", plain)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health)
        app.router.add_get("/healthz", health)
        app.router.add_get("/metrics", metrics)
        self.sleep.install(app)
        return app


def _usage(req: Request) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.generated,
        "total_tokens": req.prompt_tokens + req.generated,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }
    if req.prefilled_by:  # disaggregated: its prompt ran on that instance
        usage["galaxy_prefill_instance"] = req.prefilled_by
    return usage


def _error(status: int, message: str) -> web.Response:
    kind = "invalid_request_error" if status == 400 else "rate_limit_error"
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)  # fmt: skip


async def _sse(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


async def serve(
    profile_name: str,
    host: str,
    port: int,
    model: str,
    *,
    kv_inbox_mb: int = 64,
    kv_scale: float = 1.0,
    kv_unix: str = "",
    max_running: int = 0,
) -> None:
    """Load (the profile's load time), then serve until cancelled
    (``max_running``: the running batch's bound, 0 the profile's)."""
    # Imported here: the disaggregation routes build on this module.
    from controlplane.llm import kvwire
    from controlplane.llm.pdroutes import Disaggregation

    prof = profile(profile_name)
    if max_running:
        prof = dataclasses.replace(prof, max_running=max_running)
    await asyncio.sleep(prof.load_s)  # weights "loading": not ready before
    server = LlmServer(Engine(prof), model)
    app = server.app()
    disagg = Disaggregation(server, kvwire.KvInbox(kv_inbox_mb << 20), kv_scale)
    disagg.install(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    # Same-node KV transfers skip the TCP stack.
    instance = os.environ.get("GALAXY_INSTANCE_ID", "")
    stop = await kvwire.listen_local(runner, kv_unix, instance, disagg.inbox)
    try:
        await server.run()
    finally:
        stop()
        await runner.cleanup()


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a malformed request (e.g. a router probing with HTTP/2
    prior knowledge) with a full traceback; one line names it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, web.HTTPException) or type(exc).__name__ == "BadHttpMessage":
            record.msg, record.args = (
                "refused a malformed request: %s",
                (" ".join(str(exc).split())[:120],),
            )
            record.exc_info = record.exc_text = None
        return True


def main(argv: list[str] | None = None) -> int:
    """Command line (the node agent sets $HOST and $PORT)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="smollm2-135m-cpu")
    p.add_argument("--model", default=os.environ.get("GALAXY_FUNCTION", ""),
                   help="model id it answers to (default: the function's name)")  # fmt: skip
    p.add_argument(
        "--kv-inbox-mb",
        type=int,
        default=64,
        help="room for KV caches received from prefill instances (disaggregation); "
        "it must fit the instance's memory (the llm-emulated runtime's default: 128 MiB)",
    )
    p.add_argument(
        "--kv-scale",
        type=float,
        default=1.0,
        help="divide the emulated KV cache's bytes by this (a large model's cache "
        "on a small machine)",
    )
    p.add_argument("--kv-unix", default=os.environ.get("GALAXY_KV_UNIX", ""),
                   help="also listen on this Unix socket (same-node KV transfers)")  # fmt: skip
    p.add_argument("--max-running", type=int, default=0,
                   help="requests in the running batch at most (0: the profile's); "
                   "fewer makes requests queue in the engine sooner")  # fmt: skip
    a = p.parse_args(argv)
    logging.getLogger("aiohttp.server").addFilter(_OneLineBadRequests())
    try:
        profile(a.profile)
    except ValueError as e:
        print(f"emulated LLM: --profile: {e}", file=sys.stderr)
        return 2
    if a.kv_inbox_mb < 0 or not a.kv_scale >= 1 or a.max_running < 0:
        print("emulated LLM: --kv-inbox-mb >= 0, --kv-scale >= 1, --max-running >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    try:
        kv = {"kv_inbox_mb": a.kv_inbox_mb, "kv_scale": a.kv_scale, "kv_unix": a.kv_unix}
        asyncio.run(serve(a.profile, host, port, a.model or a.profile, **kv,
                          max_running=a.max_running))  # fmt: skip
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
