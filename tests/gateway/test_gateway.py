"""The gateway with clients we did not write: curl, the openai package and a
KServe v2 request, against real function processes."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import aiohttp
import pytest

from controlplane.gateway.proxy import CLIENT_GONE
from tests.cluster import eventually
from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")


async def curl(*args: str, max_s: float = 60) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        ["curl", "-sS", "--max-time", str(max_s), *args],
        capture_output=True,
        text=True,
        timeout=max_s + 5,
    )


@pytest.mark.slow
async def test_curl_by_path_and_by_host(gw: Gateway) -> None:
    r = await curl(f"{gw.url}/functions/echo", "-d", "hi")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["echo"] == "hi"
    r = await curl(f"{gw.url}/any/path", "-H", "Host: echo.galaxy.local", "-d", "by host")
    assert json.loads(r.stdout)["echo"] == "by host"


@pytest.mark.slow
async def test_curl_no_buffer_sees_the_stream_as_it_is_produced(gw: Gateway) -> None:
    words = [f"w{i}" for i in range(12)]
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--no-buffer", f"{gw.url}/functions/stream", "-d", " ".join(words),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 30)
    # The first word is here while the function is still producing the rest
    # (12 chunks, 50 ms apart): nothing buffered the whole answer.
    assert first == b"w0\n"
    assert proc.returncode is None
    rest = await asyncio.wait_for(proc.stdout.read(), 30)
    assert (first + rest).decode().split() == words
    assert await proc.wait() == 0


async def test_server_sent_events_pass_through(gw: Gateway) -> None:
    r = await curl(
        "--no-buffer", "-H", "Accept: text/event-stream", f"{gw.url}/functions/stream", "-d", "a b"
    )
    assert r.stdout == "data: a\n\ndata: b\n\n"


@pytest.mark.slow
async def test_openai_package_chat_completions_stream_and_not(gw: Gateway) -> None:
    openai = pytest.importorskip("openai")

    def talk() -> tuple[str, list[str], list[str]]:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        whole = client.chat.completions.create(
            model="stream", messages=[{"role": "user", "content": "hello there you"}]
        )
        parts = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="stream",
                messages=[{"role": "user", "content": "streamed words here"}],
                stream=True,
            )
        ]
        models = [m.id for m in client.models.list()]
        return whole.choices[0].message.content or "", parts, models

    whole, parts, models = await asyncio.to_thread(talk)
    assert whole.split() == ["hello", "there", "you"]
    assert len(parts) == 3 and "".join(parts).split() == ["streamed", "words", "here"]
    assert {"echo", "stream"} <= set(models)


async def test_kserve_v2_and_v1_requests(gw: Gateway) -> None:
    infer = {
        "id": "req-1",
        "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}],
    }
    r = await curl(
        f"{gw.url}/v2/models/stream/infer", "-H", "Content-Type: application/json",
        "-d", json.dumps(infer),
    )  # fmt: skip
    out = json.loads(r.stdout)
    assert out["model_name"] == "stream" and out["id"] == "req-1"
    assert out["outputs"][0]["data"] == [1.5, 2.5] and out["outputs"][0]["datatype"] == "FP32"
    r = await curl(f"{gw.url}/v1/models/stream:predict", "-d", json.dumps({"instances": [[1, 2]]}))
    assert json.loads(r.stdout) == {"predictions": [[1, 2]]}
    r = await curl("-w", "%{http_code}", "-o", "/dev/null", f"{gw.url}/v2/health/ready")
    assert r.stdout == "200"


async def test_clear_errors(gw: Gateway) -> None:
    r = await curl("-w", "\n%{http_code}", f"{gw.url}/functions/nope", "-d", "x")
    body, code = r.stdout.rsplit("\n", 1)
    assert code == "404" and "nope" in json.loads(body)["error"]["message"]
    r = await curl("-w", "\n%{http_code}", f"{gw.url}/v1/chat/completions", "-d", '{"messages":[]}')
    body, code = r.stdout.rsplit("\n", 1)
    assert code == "400" and "model" in json.loads(body)["error"]["message"]
    long = "x" * 100_000
    r = await curl("-w", "\n%{http_code}", f"{gw.url}/functions/{long[:5000]}", "-d", "x")
    body, code = r.stdout.rsplit("\n", 1)
    assert code == "404" and len(body) < 1024  # the name is not echoed back whole


async def test_a_client_that_goes_away_mid_stream_frees_its_slot(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    words = " ".join(f"w{i}" for i in range(200))  # 10 s of stream at 50 ms a chunk
    gone = CLIENT_GONE._value.get()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/functions/stream", data=words) as resp:
            assert resp.status == 200
            assert await resp.content.readline() == b"w0\n"
            router = gw.cluster.parts["d-0"].component.servicer.router_of("stream")
            assert sum(i.in_flight for i in router.instances.values()) == 1
        # The response is closed here, long before the function finished.
    await eventually(
        lambda: sum(i.in_flight for i in router.instances.values()) == 0,
        within_s=5.0,
        what="the slot is released",
    )
    await eventually(lambda: CLIENT_GONE._value.get() > gone, 5.0, "the cut counted")
    # A client that leaves is not an error of the gateway's: no traceback.
    assert not [r for r in caplog.records if r.exc_info], caplog.text[-2000:]
