"""SLO control under a real ``galaxy up`` with emulated LLM instances
(``--max-running=1``: each engine runs one request at a time, so requests
sent together queue in it and their TTFT grows):

- A function whose TTFT exceeds its ``autoscaling.ttft_ms`` scales out
  under a load its concurrency target alone does not scale on: Dispatch
  reads the TTFT histograms it scrapes and observes more than the
  requests in flight.
- At overload, a request of the sheddable class is refused through the
  gateway (curl: 429 with Retry-After, the reason named) while a critical
  one is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from controlplane.bench.llmup import Up
from tests.llm.test_routed_fleet import client, dispatch_log_line, shared_up, up, write_spec

__all__ = ["shared_up", "up"]  # (the fixtures, shared with test_routed_fleet)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

ONE_AT_A_TIME = ["--profile=smollm2-135m-cpu", "--max-running=1"]


async def loop_requests(c: openai.AsyncOpenAI, model: str, tag: str, priority: str) -> None:
    """Short completions one after another, until cancelled."""
    k = 0
    while True:
        k += 1
        await c.chat.completions.create(
            model=model,
            max_tokens=30,
            messages=[{"role": "user", "content": f"{tag} request {k}"}],
            extra_headers={"X-Galaxy-Priority": priority},
        )


async def deploy(up: Up, tmp_path: Path, name: str, top: int, **extra: object) -> None:
    """Deploy an emulated LLM that runs one request at a time; wait for it."""
    spec = write_spec(tmp_path / "s.yaml", name, 1, top, args=ONE_AT_A_TIME, **extra)
    assert name in await up.cli("deploy", "-f", str(spec))
    await up.wait_instances(f"{name}-00001", 1)


@contextlib.asynccontextmanager
async def critical_load(up: Up, name: str, clients: int) -> AsyncIterator[None]:
    """``clients`` critical clients sending one request after another."""
    c = client(up)
    load = [
        asyncio.create_task(loop_requests(c, name, f"u{u}", "critical")) for u in range(clients)
    ]
    try:
        yield
    finally:
        for t in load:
            t.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await c.close()


@pytest.mark.timeout(300)  # galaxy up, then a KPA window on a loaded machine
async def test_ttft_over_target_scales_out_where_concurrency_would_not(
    up: Up, tmp_path: Path
) -> None:
    # 4-5 requests in flight where each instance is to carry 6: the
    # concurrency target alone wants one instance; with the TTFT pressure
    # (at most 2x) two. (Critical: a queue this long would shed standard
    # requests, see the next test.)
    await deploy(up, tmp_path, "slo-llm", 3, concurrency=6, autoscaling={"ttft_ms": 100})
    async with critical_load(up, "slo-llm", 5):
        # (the only function: its first start, "at zero", says no "concurrent over")
        line = await dispatch_log_line(up, "concurrent over", limit_s=90.0)
    assert "scaling slo-llm-00001 out by" in line, line
    # The observed value is the (at most) 5 in flight times the TTFT pressure.
    got = re.search(r"([0-9.]+) concurrent", line)
    assert got is not None, line
    assert float(got.group(1)) > 5.0, line


def curl(url: str, token: str, priority: str) -> tuple[int, dict[str, str], str]:
    """One chat completion through the gateway with curl: (status, headers, body)."""
    body = json.dumps(
        {"model": "shed-llm", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    )
    out = subprocess.run(
        ["curl", "-s", "-i", "-m", "60", url, "-H", "Content-Type: application/json",
         "-H", f"Authorization: Bearer {token}", "-H", f"X-Galaxy-Priority: {priority}",
         "-d", body],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout  # fmt: skip
    head, _, text = out.replace("\r\n", "\n").partition("\n\n")
    lines = head.splitlines()
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return status, headers, text


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.timeout(300)  # galaxy up, then a few scrapes on a loaded machine
async def test_at_overload_the_sheddable_class_is_shed_and_critical_served(
    up: Up, tmp_path: Path
) -> None:
    await deploy(up, tmp_path, "shed-llm", 1, autoscaling={"ttft_ms": 100})
    url = f"http://{up.gateway}/v1/chat/completions"
    # Not overloaded: every class is served.
    status, _, _ = await asyncio.to_thread(curl, url, up.token, "sheddable")
    assert status == 200
    # Six critical clients, one request at a time each, on an engine that
    # runs one: five wait, each ~0.5 s: a wait of seconds for a 0.1 s target.
    async with critical_load(up, "shed-llm", 6):
        shed = None
        for _ in range(60):  # until Dispatch's scrapes show the queue and the rate
            status, headers, text = await asyncio.to_thread(curl, url, up.token, "sheddable")
            if status == 429:
                shed = (headers, text)
                break
            assert status == 200, text
            await asyncio.sleep(0.5)
        assert shed is not None, "a sheddable request was never shed"
        headers, text = shed
        assert "retry-after" in headers
        message = json.loads(text)["error"]["message"]
        assert "sheddable request shed: predicted wait" in message, message
        status, _, text = await asyncio.to_thread(curl, url, up.token, "critical")
        assert status == 200, text
        assert json.loads(text)["choices"][0]["message"]["content"]
        status, _, text = await asyncio.to_thread(curl, url, up.token, "urgent")
        assert status == 400 and "X-Galaxy-Priority" in text
