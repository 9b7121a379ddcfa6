"""An emulated LLM deployed as a function under a real `galaxy up`, called
through the gateway's OpenAI routes by the official `openai` client,
streaming and not (the body's `model` names the function)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
import pytest

from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_openai_client_through_the_gateway(tmp_path, monkeypatch) -> None:
    # The runtime runs `python3`: this interpreter's, as in an activated venv
    # (the emulated server needs aiohttp and prometheus_client).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(REPO / "examples" / "llm-emulated.yaml"))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=60
        )
        chat = await client.chat.completions.create(
            model="tiny-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert chat.choices[0].message.content == "tok1 tok2 tok3 tok4"
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        stream = await client.chat.completions.create(
            model="tiny-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=3,
            stream=True,
        )  # fmt: skip
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(p or "" for p in pieces) == " tok1 tok2 tok3"
        await client.close()
    finally:
        g.stop()
