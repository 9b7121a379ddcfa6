"""Shared by the tests of sleeping instances under a real `galaxy up`: an
emulated LLM function that may sleep, deployed (``sleepy_up``), and the
views a test checks: `galaxy status`, a component's metric, an instance's
own `/v1/galaxy/state` through its node's entry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest

from controlplane.runtime import leasetoken
from tests.integration.upctl import REPO, GalaxyUp

SPEC = """\
name: sleepy-llm
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
  scale_to_zero_grace_ms: 600000
  max_asleep: 2
  keep_asleep_ms: {keep_ms}
"""
BURST_TOKENS = 150  # ~2.5 s a request at the profile's ~15 ms per token


def status(g: GalaxyUp) -> list[dict]:
    """The function's instances as `galaxy status -o json` shows them."""
    r = g.cli("status", "-o", "json")
    assert r.returncode == 0, r.stderr
    return [
        s
        for s in json.loads(r.stdout).get("instances", [])
        if s["instance"]["function"].startswith("sleepy-llm-")
    ]


def dispatch_metric(g: GalaxyUp, name: str, component: str = "dispatch-0") -> float:
    url = f"http://{g.component(component)['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Poll the control plane's view (status, metrics) until ``check``: the
    autoscaler acts on its own ticks, with no event to wait on from here."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.5)


async def engine_state(g: GalaxyUp, instance: dict) -> dict:
    """The instance's own answer, through its node's entry (which asks for
    a lease token, as Dispatch's calls carry)."""
    key = leasetoken.load(g.endpoints["tls_dir"])
    assert key is not None
    token = key.sign(instance["instance_id"], time.time_ns() // 1_000_000 + 5_000)
    async with aiohttp.ClientSession() as s:
        async with s.get(
            f"http://{instance['address']}/v1/galaxy/state",
            headers={leasetoken.HEADER: token},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as r:
            assert r.status == 200, await r.text()
            return await r.json()


Ask = Callable[[int], Awaitable[str]]


@contextlib.asynccontextmanager
async def sleepy_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_ms: int, *up_args: str
) -> AsyncIterator[tuple[GalaxyUp, Ask]]:
    """`galaxy up` (one node, ``up_args``) with the sleepy function deployed,
    and ``ask(n)``: a chat completion of n tokens through the gateway."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    spec = tmp_path / "sleepy.yaml"
    spec.write_text(SPEC.format(artifact=REPO / "examples" / "llm_emulated.py", keep_ms=keep_ms))
    g = GalaxyUp(tmp_path / "run", "--nodes", "1", *up_args)
    g.start()
    try:
        r = g.cli("deploy", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=120
        )

        async def ask(n: int) -> str:
            c = await client.chat.completions.create(
                model="sleepy-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=n
            )
            return c.choices[0].message.content or ""

        try:
            yield g, ask
        finally:
            await client.close()
    finally:
        g.stop()


async def burst(ask: Ask) -> None:
    """Three requests at once (each ~2.5 s long): three instances' worth."""
    assert len(await asyncio.gather(*(ask(BURST_TOKENS) for _ in range(3)))) == 3


def slept(g: GalaxyUp) -> int:
    """Instances Dispatch put to sleep so far (counted once each answered
    its sleep call: asleep on its own account too)."""
    return int(dispatch_metric(g, "galaxy_llm_sleeps_total"))
