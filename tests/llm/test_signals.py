"""Load signals scraped from the emulated server's real /metrics over a
socket (vLLM's names), the bounded prefix-block digest, tokens/s between
scrapes, and clear errors for pages that are not signals."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest
from aiohttp import web

from controlplane.llm.engine import Engine, Request
from controlplane.llm.profiles import profile
from controlplane.llm.server import PREFIX_BLOCKS_REPORTED, LlmServer
from controlplane.runtime.llmsignals import (
    MAX_BYTES,
    LoadBook,
    Sample,
    SignalError,
    digest,
    parse,
    scrape,
)

# A cache no larger than the report: every cached block is reported.
PROF = dataclasses.replace(
    profile("smollm2-135m-cpu"), load_s=0.0, prefill_tps=50_000.0, prefix_cache_blocks=256
)


@pytest.fixture
async def served():
    engine = Engine(PROF)
    server = LlmServer(engine, "tiny-emulated")
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", engine
    await runner.cleanup()


async def test_scrape_reads_queue_kv_tokens_and_blocks(served) -> None:
    url, engine = served
    # State put in the engine directly: two running, one waiting, blocks cached.
    for k in range(3):
        engine.submit(Request(f"r{k}", 100, 50, blocks=(f"b{k}a", f"b{k}b")))
    step = engine.plan(0.0)
    assert step is not None
    engine.complete(step)
    engine.submit(Request("late", 10, 5))
    async with aiohttp.ClientSession() as s:
        sample = await scrape(s, url + "/metrics")
    assert sample.waiting == 1
    assert sample.running == 3
    assert sample.kv_usage == pytest.approx(engine.kv_usage)
    assert sample.generation_tokens == 3
    assert {"b0a", "b1b", "b2a"} <= sample.blocks


async def test_scrape_errors_name_the_cause(served) -> None:
    url, _ = served
    async with aiohttp.ClientSession() as s:
        with pytest.raises(SignalError, match="HTTP 404"):
            await scrape(s, url + "/nope")
        with pytest.raises(SignalError, match=r"ClientConnectorError|ClientOSError"):
            await scrape(s, "http://127.0.0.1:1/metrics")


async def test_scrape_has_a_deadline() -> None:
    release = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/metrics", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(SignalError, match="TimeoutError"):
                await scrape(s, f"http://127.0.0.1:{port}/metrics", timeout_s=0.2)
    finally:
        release.set()  # (else cleanup waits out the handler)
        await runner.cleanup()


def test_parse_reads_lora_adapters_and_sums_models() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:num_requests_waiting{model_name="b"} 3\n'
        'vllm:lora_requests_info{running_lora_adapters="sql,chat",waiting_lora_adapters="x",'
        'max_lora="4"} 1.7e9\n'
    )
    s = parse(text)
    assert s.waiting == 5
    assert s.adapters == {"sql", "chat", "x"}
    assert s.kv_usage is None and s.generation_tokens is None


def test_parse_refuses_garbage_and_oversize_without_echo() -> None:
    with pytest.raises(SignalError, match="not Prometheus text") as e:
        parse("this is { not metrics\n" * 3)
    assert "this is { not metrics\nthis" not in str(e.value)
    with pytest.raises(SignalError, match="over the"):
        parse("#" * (MAX_BYTES + 1))


def test_parse_bounds_blocks() -> None:
    text = "".join(f'galaxy:prefix_cache_block{{block="h{k}"}} 1\n' for k in range(50))
    assert len(parse(text, max_blocks=7).blocks) == 7


def test_digest_spreads_a_bounded_report_over_the_cache() -> None:
    recent = [f"h{k}" for k in range(4000)]
    out = digest(recent, 100, 4000)
    assert 50 <= len(out) <= 100  # a 1-in-40 hash sample of 4,000
    # Sampled by hash, the report reaches far past the 100 newest blocks.
    assert max(recent.index(h) for h in out) > 1000
    assert digest(recent, 100, 100) == recent[:100]
    assert PREFIX_BLOCKS_REPORTED <= 256


def test_load_book_rates_and_staleness() -> None:
    book = LoadBook(max_age_s=1.0)
    book.observe("a", Sample(generation_tokens=100.0), 10.0)
    load = book.observe("a", Sample(generation_tokens=300.0, waiting=2, running=1), 10.5)
    assert load.tokens_per_s == pytest.approx(400.0)
    assert load.queue == 3
    # A restarted server (counter went down) gives no rate, not a negative one.
    assert book.observe("a", Sample(generation_tokens=5.0), 11.0).tokens_per_s == 0.0
    assert book.get("a", 11.5) is not None
    assert book.get("a", 12.5) is None and book.fresh(12.5) == {}
    book.forget("a")
    assert book.get("a", 11.0) is None
