"""Inference graphs through a real gateway, with real function processes
(the echo example deployed under three names), called with curl: a
Sequence, an Ensemble, a Splitter and a Switch; a failing step names
itself; bad requests and bad graph files are refused naming the field."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from controlplane.gateway.config import GatewayConfig
from tests.gateway.test_gateway import curl
from tests.models.irisgw import example, serving

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def step(name: str, function: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "function": function, **kw}


GRAPHS: dict[str, dict[str, Any]] = {
    "seq": {"root": {"router": "Sequence", "steps": [
        step("first", "echo-a"), step("second", "echo-b", data="$response")]}},
    "ens": {"root": {"router": "Ensemble", "steps": [step("a", "echo-a"), step("b", "echo-b")]}},
    "split": {"root": {"router": "Splitter", "steps": [
        step("a", "echo-a", weight=30), step("b", "echo-b", weight=70)]}},
    "switch": {"root": {"router": "Switch", "steps": [
        step("to-a", "echo-a", condition={"pointer": "/kind", "op": "==", "value": "a"}),
        step("big", "echo-b", condition={"pointer": "/n", "op": ">", "value": 10}),
    ]}},
    "broken": {"root": {"router": "Sequence", "steps": [
        step("ok", "echo-a"), {"name": "inner", "node": "fan"}]},
        "fan": {"router": "Ensemble", "steps": [step("fine", "echo-b"), step("gone", "nope")]}},
}  # fmt: skip


class Env:
    def __init__(self, url: str) -> None:
        self.url = url


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("graphs")
    graphs = tmp / "graphs"
    graphs.mkdir()
    for name, nodes in GRAPHS.items():
        (graphs / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "nodes": nodes}))
    cfg = GatewayConfig(request_timeout_s=30.0, graphs_dir=str(graphs))
    docs = [example("echo", tmp, name=name) for name in ("echo-a", "echo-b")]
    async with serving(tmp, cfg, docs) as url:
        yield Env(url)


async def call(env: Env, graph: str, body: Any) -> tuple[int, Any]:
    r = await curl("-w", "\n%{http_code}", f"{env.url}/graphs/{graph}", "-H",
                   "Content-Type: application/json", "-d", json.dumps(body))  # fmt: skip
    assert r.returncode == 0, r.stderr
    text, code = r.stdout.rsplit("\n", 1)
    return int(code), json.loads(text)


async def test_sequence_feeds_the_response_on(env: Env) -> None:
    code, out = await call(env, "seq", {"x": 1})
    assert code == 200, out
    assert out["function"] == "echo-b"
    first = json.loads(out["echo"])  # what echo-b got: echo-a's answer
    assert first["function"] == "echo-a"
    assert json.loads(first["echo"]) == {"x": 1}


async def test_ensemble_answers_every_step_by_name(env: Env) -> None:
    code, out = await call(env, "ens", {"instances": [[1, 2]]})
    assert code == 200, out
    assert list(out) == ["a", "b"]
    assert {k: v["function"] for k, v in out.items()} == {"a": "echo-a", "b": "echo-b"}
    assert all(json.loads(v["echo"]) == {"instances": [[1, 2]]} for v in out.values())


async def test_switch_takes_the_first_matching_step(env: Env) -> None:
    assert (await call(env, "switch", {"kind": "a", "n": 99}))[1]["function"] == "echo-a"
    assert (await call(env, "switch", {"kind": "b", "n": 99}))[1]["function"] == "echo-b"
    # No condition holds: the input comes back unchanged (KServe's rule).
    assert await call(env, "switch", {"kind": "b", "n": 1}) == (200, {"kind": "b", "n": 1})


async def test_splitter_shares_follow_the_weights(env: Env) -> None:
    n = 200
    counts: Counter[str] = Counter()
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(f"{env.url}/graphs/split", json={"i": 1}) as r:
                assert r.status == 200
                counts[(await r.json())["function"]] += 1

        for _ in range(n // 10):
            await asyncio.gather(*(one() for _ in range(10)))
    # echo-a's count is Binomial(200, 0.3): mean 60, sd 6.5; 5 sd either
    # side fails a correct splitter with probability below 1e-6.
    assert counts["echo-a"] + counts["echo-b"] == n
    assert 28 <= counts["echo-a"] <= 92, counts


async def test_a_failing_step_names_itself(env: Env) -> None:
    code, out = await call(env, "broken", {"x": 1})
    assert code == 404, out
    err = out["error"]
    assert (err["graph"], err["step"], err["function"]) == ("broken", "root.inner.gone", "nope")
    assert "step root.inner.gone (function nope)" in err["message"]


async def test_bad_requests_are_refused(env: Env) -> None:
    code, out = await call(env, "no-such-graph", {})
    assert code == 404 and "no graph 'no-such-graph'" in out["error"]["message"]
    r = await curl("-w", "\n%{http_code}", f"{env.url}/graphs/seq", "-d", "{not json")
    text, status = r.stdout.rsplit("\n", 1)
    assert status == "400" and "body: not valid JSON" in json.loads(text)["error"]["message"]
    r = await curl("-w", "\n%{http_code}", f"{env.url}/graphs/seq")
    assert r.stdout.rsplit("\n", 1)[1] == "405"


async def test_kserve_explain_is_forwarded_like_predict(env: Env) -> None:
    r = await curl(f"{env.url}/v1/models/echo-a:explain", "-d", "why")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["function"], out["echo"]) == ("echo-a", "why")
