"""Prefill/decode disaggregation on the real request path: a real `galaxy up`
with two nodes, emulated LLM instances as real processes, the official
`openai` client through the gateway.

A decode function names its prefill function (`pd: {prefill: NAME}`); each
request's prompt runs on a prefill instance paired by Dispatch with the
decode instance's node, its KV cache (real bytes) goes straight to the
decode instance (in shared memory passed over the decode instance's Unix
socket when both share a node), and the decode instance continues from it: `usage` names the prefill
instance and every prompt token counts as cached there. A decode function
whose prefill pool cannot serve falls back to aggregated decode, and the
gateway's metric says why.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from controlplane.bench.llmup import Up
from controlplane.bench.pdbench import pd_outcomes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = str(REPO / "examples" / "llm_emulated.py")
PROMPT = " ".join(f"w{i}" for i in range(40))


def write_spec(path: Path, name: str, **extra: object) -> Path:
    spec = {
        "name": name,
        "public": True,
        "runtime": "llm-emulated",
        "artifact": ARTIFACT,
        "args": ["--profile=smollm2-135m-cpu"],
        **extra,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    # Process sandboxes: instances reach each other (Up.processes).
    async with Up.processes(tmp_path / "run", 2) as g:
        yield g


async def nodes_of(g: Up) -> dict[str, str]:
    """instance id -> node id, from `galaxy status`."""
    st = json.loads(await g.cli("status", "-o", "json"))
    return {i["instance"]["instance_id"]: i["instance"]["node_id"] for i in st["instances"]}


async def chat(c: openai.AsyncOpenAI, model: str, user: str) -> tuple[str, Any]:
    raw = await c.chat.completions.with_raw_response.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": f"{PROMPT} {user}"}]
    )
    done = raw.parse()
    assert done.usage is not None
    return raw.headers["X-Galaxy-Instance"], done.usage


@pytest.mark.timeout(300)  # five instances to start on two shared cores, not the suite's 120 s
async def test_a_request_is_prefilled_on_a_paired_instance_and_decoded_from_its_cache(
    up: Up, tmp_path: Path
) -> None:
    prefill = await up.deploy(write_spec(tmp_path / "p.yaml", "pd-prefill"), 3, tmp_path)
    decode = await up.deploy(
        write_spec(tmp_path / "d.yaml", "pd-decode", pd={"prefill": prefill}), 2, tmp_path
    )
    where = await nodes_of(up)
    prefills = {i for i in where if i.startswith(prefill)}
    c = openai.AsyncOpenAI(base_url=f"http://{up.gateway}/v1", api_key=up.token, timeout=60)
    for k in range(6):
        decoded_on, usage = await chat(c, decode, f"user {k}")
        extra = usage.model_extra or {}
        origin = extra.get("galaxy_prefill_instance")
        # Prefilled elsewhere: on an instance of the prefill pool, and the
        # decode instance ran no prefill (the whole prompt came as a cache).
        assert origin in prefills, f"usage {usage}: not prefilled by {sorted(prefills)}"
        assert decoded_on.startswith(decode)
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens > 40
        assert usage.completion_tokens == 4
        # Placement-aware: a prefill instance on the decode's node when one is there.
        if any(where[p] == where[decoded_on] for p in prefills):
            assert where[origin] == where[decoded_on], (origin, decoded_on, where)
    # Streaming, with usage at the end, the same way.
    stream = await c.chat.completions.create(
        model=decode,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"{PROMPT} streamed"}],
    )
    chunks = [ch async for ch in stream]
    texts = [ch.choices[0].delta.content for ch in chunks if ch.choices]
    assert len(texts) == 5
    last = chunks[-1].usage
    assert last is not None and (last.model_extra or {}).get("galaxy_prefill_instance") in prefills
    assert (await pd_outcomes(up.gateway_metrics)).get("disaggregated", 0) >= 7
    await c.close()


async def test_without_a_prefill_pool_the_request_is_decoded_aggregated(
    up: Up, tmp_path: Path
) -> None:
    # The named prefill function does not exist: Dispatch refuses the
    # prefill grant, the decode instance prefills itself.
    decode = await up.deploy(
        write_spec(tmp_path / "d.yaml", "pd-lonely", pd={"prefill": "pd-missing"}), 1, tmp_path
    )
    c = openai.AsyncOpenAI(base_url=f"http://{up.gateway}/v1", api_key=up.token, timeout=60)
    _, usage = await chat(c, decode, "alone")
    assert "galaxy_prefill_instance" not in (usage.model_extra or {})
    assert usage.completion_tokens == 4
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0  # prefilled here
    assert (await pd_outcomes(up.gateway_metrics)).get("fallback_dispatch", 0) == 1
    await c.close()
