"""Scale-down drains: under a real `galaxy up`, an emulated LLM scaled out by
three concurrent streams scales back in while one long stream is still
open, and that stream finishes with every token (nothing closed mid-stream).
The stream is read with the official `openai` client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = """\
name: drain-llm
public: true
runtime: llm-emulated
artifact: {artifact}
args: [--profile=smollm2-135m-cpu]
concurrency: 1
min_scale: 0
max_scale: 3
autoscaling:
  stable_window_ms: 6000
  # (a panic window of at least the 2 s autoscaler tick)
  panic_window_percent: 50
  scale_to_zero_grace_ms: 60000
"""
# Tokens of the long stream: ~30 s at the profile's ~15 ms per token. It
# must stay open through the scale-in, which comes a stable window (6 s, the
# least allowed) and an autoscaler round or two after the short streams end:
# ~10 s, ~20 s when the cold starts of a loaded machine delay the short
# streams. The rest of the stream is time the test waits for nothing (3,000
# tokens made it 45 s).
LONG = 2000


def instances(g: GalaxyUp) -> int:
    """Instances of the function that are not draining (`galaxy status`)."""
    r = g.cli("status", "-o", "json")
    assert r.returncode == 0, r.stderr
    return sum(
        1
        for s in json.loads(r.stdout).get("instances", [])
        # (instances name the function's revision: drain-llm-00001)
        if s["instance"]["function"].startswith("drain-llm-") and not s.get("draining")
    )


async def test_scale_down_finishes_open_streams(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    spec = tmp_path / "drain.yaml"
    spec.write_text(SPEC.format(artifact=REPO / "examples" / "llm_emulated.py"))
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=180
        )

        async def stream(
            n: int, first: asyncio.Event | None = None
        ) -> tuple[list[str], str | None]:
            s = await client.chat.completions.create(
                model="drain-llm", messages=[{"role": "user", "content": "hi"}],
                max_tokens=n, stream=True,
            )  # fmt: skip
            got: list[str] = []
            reason = None
            async for c in s:
                if first is not None:
                    first.set()
                if c.choices:
                    got.append(c.choices[0].delta.content or "")
                    reason = c.choices[0].finish_reason or reason
            return got, reason

        # The long stream first, until its first token: it then holds the
        # first instance (concurrency 1) for ~30 s, so the short ones need
        # instances of their own. Started together, the short ones could
        # take the first instance one after the other before a second was
        # up (seen once in CI) and nothing would scale out.
        first = asyncio.Event()
        long = asyncio.create_task(stream(LONG, first))
        began = asyncio.create_task(first.wait())
        await asyncio.wait({long, began}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        began.cancel()
        assert first.is_set(), long.exception() if long.done() else "no first token in 120 s"
        shorts = asyncio.gather(stream(10), stream(10))
        peak = 0
        while not shorts.done():  # the three streams scale it out
            peak = max(peak, await asyncio.to_thread(instances, g))
            await asyncio.sleep(0.3)
        assert all(reason == "length" for _, reason in await shorts)
        peak = max(peak, await asyncio.to_thread(instances, g))
        assert peak >= 2, "the three streams did not scale the function out"
        # Scale-in while the long stream is open: the idle instances go.
        deadline = time.monotonic() + 90
        seen = peak
        while not long.done() and time.monotonic() < deadline and seen >= peak:
            seen = min(seen, await asyncio.to_thread(instances, g))
            await asyncio.sleep(1.0)
        assert seen < peak and not long.done(), "no scale-down happened while the stream was open"
        pieces, reason = await long
        text = "".join(pieces).split()
        assert reason == "length"
        assert text == [f"tok{k}" for k in range(1, LONG + 1)]
        await client.close()
    finally:
        g.stop()
