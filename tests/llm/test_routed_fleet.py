"""The LLM picker and the LLM scaling metric on the real request path: a real
`galaxy up`, emulated LLM instances as real processes on real sockets, the
official `openai` client through the gateway's OpenAI routes.

- A shared-prefix workload sent concurrently lands each system prompt on the
  instance that holds it: every request after a prompt's first is a prefix
  hit (the emulated server's ``usage.prompt_tokens_details.cached_tokens``).
- A queue on one instance steers new requests to the others.
- A function with ``autoscaling.metric: queue`` scales out under a load its
  concurrency (64 slots per instance) would not scale on, and Dispatch's
  decision names the metric.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
import yaml

from controlplane.bench.llmup import Up
from controlplane.runtime import leasetoken

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = str(REPO / "examples" / "llm_emulated.py")
#: three system prompts of 64 words (4 blocks of 16), distinct from word one
SYSTEMS = [" ".join(f"p{k}w{j}" for j in range(64)) for k in range(3)]


def write_spec(path: Path, name: str, n: int, top: int, **extra: object) -> Path:
    spec = {
        "name": name,
        "public": True,
        "runtime": "llm-emulated",
        "artifact": ARTIFACT,
        "args": ["--profile=smollm2-135m-cpu"],
        "min_scale": n,
        "max_scale": top,
        **extra,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Up]:
    """One `galaxy up` for the module: its tests deploy functions of their
    own names, and a start is most of a test's cost."""
    # Instances run `python3`: this interpreter's (aiohttp, prometheus_client).
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    g = Up(tmp_path_factory.mktemp("llmup") / "run", nodes=1, env=env)
    await g.start()
    try:
        yield g
    finally:
        await g.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def up(shared_up: Up) -> AsyncIterator[Up]:
    """The module's control plane; the functions a test deployed are deleted
    after it, so the next test finds the node's capacity free and no other
    function's instances busy (a test's long streams end with them)."""
    yield shared_up
    listed = json.loads(await shared_up.cli("functions", "-o", "json"))
    for f in listed:
        await shared_up.cli("delete", f["name"])


def client(g: Up) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{g.gateway}/v1", api_key=g.token, timeout=60)


async def chat(c: openai.AsyncOpenAI, model: str, system: str, user: str, n: int = 2):
    raw = await c.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=n,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
    )
    done = raw.parse()
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    return raw.headers["X-Galaxy-Instance"], done.usage.prompt_tokens_details.cached_tokens or 0


async def test_shared_prefixes_land_where_they_are_cached(up: Up, tmp_path: Path) -> None:
    name = await up.deploy(write_spec(tmp_path / "f.yaml", "pfx-llm", 3, 3), 3, tmp_path)
    c = client(up)
    homes: dict[int, str] = {}
    for k, s in enumerate(SYSTEMS):  # each prompt's first request (a miss)
        homes[k], _ = await chat(c, name, s, "first")
    # Three prompts on three idle instances: one each.
    assert len(set(homes.values())) == 3
    # Then four users per prompt at once, twice: the queue term alone (least
    # request) would spread a prompt's users over the fleet.
    for rnd in range(2):
        got = await asyncio.gather(
            *(
                chat(c, name, SYSTEMS[k], f"user {u} round {rnd}")
                for k in range(3)
                for u in range(4)
            )
        )
        for i, (where, cached) in enumerate(got):
            k = i // 4
            assert where == homes[k], f"prompt {k} went to {where}, not {homes[k]}"
            # The 64 system words and "system:" make 4 full blocks: 64 tokens.
            assert cached >= 64, f"prompt {k}: {cached} cached tokens"
    await c.close()


async def open_stream(c: openai.AsyncOpenAI, model: str, system: str, user: str, n: int):
    """A streaming chat completion, once its first chunk arrived (so it runs
    on its instance now): (instance, the stream)."""
    raw = await c.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=n,
        stream=True,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
    )
    stream = raw.parse()
    await stream.__anext__()
    return raw.headers["X-Galaxy-Instance"], stream


async def test_a_queue_on_one_instance_steers_new_requests_away(up: Up, tmp_path: Path) -> None:
    name = await up.deploy(write_spec(tmp_path / "q.yaml", "steer-llm", 2, 2), 2, tmp_path)
    c = client(up)
    busy, _ = await chat(c, name, SYSTEMS[0], "seed")
    # Long answers of the prompt's users stay on its instance and keep it busy...
    long = [await open_stream(c, name, SYSTEMS[0], f"long {u}", 1000) for u in range(6)]
    try:
        assert {where for where, _ in long} == {busy}
        # ...so requests with no shared prefix go to the other instance.
        fresh = [await chat(c, name, f"unrelated {u} " * 20, "q") for u in range(4)]
        assert all(where != busy for where, _ in fresh), fresh
    finally:
        for _, stream in long:
            await stream.close()
        await c.close()


async def test_a_load_dispatch_cannot_count_is_read_from_the_scraped_signals(
    up: Up, tmp_path: Path
) -> None:
    name = await up.deploy(write_spec(tmp_path / "s.yaml", "scrape-llm", 3, 3), 3, tmp_path)
    st = json.loads(await up.cli("status", "-o", "json"))
    where = {
        i["instance"].get("instance_id") or i["instance"]["instanceId"]: i["instance"]["address"]
        for i in st["instances"]
        if i["instance"]["function"].startswith(name)
    }
    assert len(where) == 3
    free, *loaded = sorted(where)
    # Requests sent to two instances directly, past Galaxy: Dispatch counts
    # none of them in flight; only their engines' /metrics show the queue
    # (more than the profile's 16 running) and the KV cache filling.
    prompt = " ".join(f"w{k}" for k in range(1000))
    # The node's entry admits a caller with a lease token for the instance:
    # signed here with the cluster's lease key, as Dispatch signs its grants.
    key = leasetoken.load(up.run_dir / "certs")
    assert key is not None
    ends_ms = time.time_ns() // 1_000_000 + 120_000
    direct = [
        openai.AsyncOpenAI(
            base_url=f"http://{where[i]}/v1", api_key="x", timeout=60,
            default_headers={leasetoken.HEADER: key.sign(i, ends_ms)},
        )
        for i in loaded
    ]  # fmt: skip
    streams = [
        await d.chat.completions.create(
            model=name, max_tokens=2000, stream=True,
            messages=[{"role": "user", "content": f"{u} {prompt}"}],
        )
        for d in direct
        for u in range(18)
    ]  # fmt: skip
    c = client(up)
    try:
        # Dispatch scrapes every 0.5 s and shows no event of it outside: wait
        # three periods (the signals, not their timing, are what is tested).
        await asyncio.sleep(1.5)
        # On a loaded instance these would wait behind its queue for long.
        async with asyncio.timeout(30):
            got = [await chat(c, name, f"fresh {u} " * 20, "q") for u in range(4)]
        assert all(w == free for w, _ in got), (free, got)
    finally:
        for st_ in streams:
            await st_.close()
        for d in direct:
            await d.close()
        await c.close()


async def test_the_queue_metric_scales_out_where_concurrency_would_not(
    up: Up, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path / "s.yaml", "qscale-llm", 1, 3,
        autoscaling={"metric": "queue", "target": 2},
    )  # fmt: skip
    said = await up.cli("deploy", "-f", str(spec))
    assert "qscale-llm" in said
    await up.wait_instances("qscale-llm-00001", 1)
    c = client(up)
    # Eight long streams: 8 in flight of 64 slots, a queue of 8 for a target of 2.
    load = [
        asyncio.create_task(chat(c, "qscale-llm", SYSTEMS[u % 3], f"load {u}", n=600))
        for u in range(8)
    ]
    try:
        line = await dispatch_log_line(up, "scaling qscale-llm", limit_s=60.0)
    finally:
        for t in load:
            t.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await c.close()
    assert ": queue " in line, line


async def dispatch_log_line(g: Up, text: str, limit_s: float) -> str:
    """The first line of a Dispatch log containing ``text`` (polled: the log
    is another process's file)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        for f in sorted((g.run_dir / "logs").glob("dispatch*.log")):
            for line in f.read_text(errors="replace").splitlines():
                if text in line:
                    return line
        await asyncio.sleep(0.5)
    raise AssertionError(f"no Dispatch log line with {text!r} within {limit_s:.0f}s")
