"""The emulated LLM server's sleep (an emulation: the profile's wake cost
is a timer) over a real socket, called with curl: the real server's routes
(`/v1/galaxy/sleep`, `/wake`, `/state`), a request that finds it asleep pays
the wake in its TTFT and wakes it, concurrent requests share one wake, and
sleeping empties the prefix cache."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from controlplane.llm.profiles import profile
from tests.llm.test_server import llm  # noqa: F401 - the emulated server fixture

WAKE_S = 0.3
PROF = dataclasses.replace(profile("smollm2-135m-cpu"), load_s=0.0, wake_s=WAKE_S)


async def curl(*args: str) -> dict:
    p = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "10", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await p.communicate()
    assert p.returncode == 0
    return json.loads(out)


async def complete(url: str, prompt: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    body = json.dumps({"model": "tiny-emulated", "prompt": prompt, "max_tokens": 1})
    got = await curl("-H", "Content-Type: application/json", "-d", body, url + "/v1/completions")
    return got, time.monotonic() - t0


@pytest.mark.slow
async def test_sleep_state_and_a_request_that_wakes_it(llm) -> None:  # noqa: F811
    url, server = await llm(PROF)
    prompt = " ".join(f"w{i}" for i in range(64))  # 4 full blocks of 16
    await complete(url, prompt)
    assert len(server.engine.prefix) == 4
    state = await curl(url + "/v1/galaxy/state")
    assert state == {
        "asleep": False, "sleeps": 0, "wakes": 0, "wake_calls": 0, "asleep_s": 0.0, "emulated": True
    }  # fmt: skip
    assert await curl("-X", "POST", url + "/v1/galaxy/sleep") == {"asleep": True, "changed": True}
    assert await curl("-X", "POST", url + "/v1/galaxy/sleep") == {"asleep": True, "changed": False}
    state = await curl(url + "/v1/galaxy/state")
    assert state["asleep"] is True and state["asleep_s"] > 0
    assert not server.engine.prefix  # the KV cache went with the context
    # Two requests find it asleep: one wake, paid by both (in their TTFT).
    (a, a_s), (b, b_s) = await asyncio.gather(complete(url, prompt), complete(url, "x y"))
    assert a["choices"][0]["text"] == "tok1" and b["choices"][0]["text"] == "tok1"
    assert min(a_s, b_s) >= WAKE_S
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert server.sleep.wakes == 1 and not server.sleep.asleep
    # Awake again: no wake cost, and nothing to wake.
    woke = await curl("-X", "POST", url + "/v1/galaxy/wake")
    assert woke == {"asleep": False, "woke_s": 0.0}
    assert server.sleep.wake_calls == 0  # (both wakes were the requests')


@pytest.mark.slow
async def test_wake_ahead_takes_the_wake_off_the_request(llm) -> None:  # noqa: F811
    url, server = await llm(PROF)
    await curl("-X", "POST", url + "/v1/galaxy/sleep")
    woke = await curl("-X", "POST", url + "/v1/galaxy/wake")
    assert woke["asleep"] is False and woke["woke_s"] >= WAKE_S
    assert not server.sleep.asleep and server.sleep.wake_calls == 1
    got, _ = await complete(url, "a b c")
    assert got["choices"][0]["text"] == "tok1"
    assert (server.sleep.sleeps, server.sleep.wakes) == (1, 1)  # the request woke nothing
