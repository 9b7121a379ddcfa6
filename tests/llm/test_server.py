"""The emulated LLM server over a real socket, called with the official
`openai` client (a client we did not write): chat and completions, streaming
with usage, TTFT at least the modeled prefill, vLLM's metric names on
/metrics, errors that name the field, 429 when the queue is full."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import openai
import pytest
from aiohttp import web

from controlplane.llm.engine import Engine
from controlplane.llm.profiles import profile
from controlplane.llm.server import LlmServer

BASE = dataclasses.replace(profile("smollm2-135m-cpu"), load_s=0.0, prefill_tps=20_000.0)


@pytest.fixture
async def llm():
    async def start(prof=BASE):
        server = LlmServer(Engine(prof), "tiny-emulated")
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        task = asyncio.create_task(server.run())
        started.append((runner, task))
        return f"http://127.0.0.1:{port}", server

    started: list = []
    yield start
    for runner, task in started:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.cleanup()


async def test_openai_client_chat_and_completions(llm) -> None:
    url, _ = await llm()
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    chat = await client.chat.completions.create(
        model="tiny-emulated", messages=[{"role": "user", "content": "hello there"}], max_tokens=5
    )
    assert chat.choices[0].message.content == "tok1 tok2 tok3 tok4 tok5"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.usage.prompt_tokens == 3  # "user:", "hello", "there"
    done = await client.completions.create(model="tiny-emulated", prompt="a b c", max_tokens=2)
    assert done.choices[0].text == "tok1 tok2"
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny-emulated"]
    # Content as a list of parts (the OpenAI API allows it; guidellm sends it),
    # and the newer max_completion_tokens.
    parts = await client.chat.completions.create(
        model="tiny-emulated",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello there"},
                                               {"type": "text", "text": "again"}]}],
        max_completion_tokens=3,
    )  # fmt: skip
    assert parts.usage is not None
    assert (parts.usage.prompt_tokens, parts.usage.completion_tokens) == (4, 3)
    await client.close()


async def test_streaming_with_usage_and_ttft_at_least_the_prefill(llm) -> None:
    slow = dataclasses.replace(BASE, prefill_tps=2000.0)
    url, _ = await llm(slow)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    prompt = " ".join(["word"] * 400)  # 401 tokens with the role: >= 0.2 s of prefill
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model="tiny-emulated", messages=[{"role": "user", "content": prompt}], max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, first, usage = [], None, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t0
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == " tok1 tok2 tok3 tok4"
    assert usage is not None and usage.completion_tokens == 4 and usage.prompt_tokens == 401
    assert first is not None and first >= 401 / 2000.0
    await client.close()


async def test_metrics_use_vllm_names_and_show_the_prefix_cache(llm) -> None:
    url, server = await llm()
    system = " ".join(f"s{i}" for i in range(64))
    async with aiohttp.ClientSession() as s:
        for user in ("alice", "bob"):
            body = {"model": "m", "max_tokens": 1,
                    "messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": user}]}  # fmt: skip
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket"):  # fmt: skip
        assert name in text, name
    assert server.engine.counters.prefix_hits >= 64  # bob reused alice's system prompt


async def test_bad_requests_name_the_field_and_a_full_queue_is_429(llm) -> None:
    url, _ = await llm(dataclasses.replace(BASE, max_waiting=0))
    async with aiohttp.ClientSession() as s:
        for body, field in (
            ({"messages": "hi"}, "messages"),
            ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
            ({"prompt": 5}, "prompt"),
            (
                {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
                "messages[0].content",
            ),
            ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ):
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            async with s.post(url + path, json=body) as r:
                assert r.status == 400
                assert (await r.json())["error"]["message"].startswith(field)
        async with s.post(url + "/v1/completions", data=b"[" * 1000) as r:
            assert r.status == 400
        async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
            assert r.status == 429  # max_waiting 0: the queue is always full
