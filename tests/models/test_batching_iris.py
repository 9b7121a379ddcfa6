"""Adaptive batching through a real gateway on the iris classifier (real
scikit-learn server processes): concurrent v1 and v2 callers each get
exactly their own rows' predictions, batches do form under load, and a
batch the function refuses is refused to every caller in it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import joblib
import numpy as np
import pytest
import pytest_asyncio

from controlplane.gateway.batcher import BATCH_HEADER
from controlplane.gateway.config import GatewayConfig
from scripts.train_iris import iris
from tests.models.irisgw import example, serving

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@dataclass
class Env:
    url: str
    model: Any


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("iris")
    batching = {"max_batch_size": 32, "max_latency_ms": 50}
    doc = example("iris", tmp, batching=batching, min_scale=1, max_scale=1)
    cfg = GatewayConfig(request_timeout_s=60.0, batch_parallel=1)
    async with serving(tmp, cfg, [doc]) as url:
        yield Env(url, joblib.load(doc["model"]["uri"]))


def rows_of(i: int) -> list[list[float]]:
    """Caller i's rows: 1 to 3 rows of the data set, different per caller."""
    data = iris().data
    return [data[(7 * i + k) % len(data)].tolist() for k in range(1 + i % 3)]


async def fire(env: Env, n: int, body_of: Any, path: str) -> list[tuple[int, Any, str]]:
    async with aiohttp.ClientSession() as http:
        # Warm: the first call starts the instance.
        async with http.post(f"{env.url}{path}", json=body_of(0)) as r:
            assert r.status == 200, await r.text()

        async def one(i: int) -> tuple[int, Any, str]:
            async with http.post(f"{env.url}{path}", json=body_of(i)) as r:
                return r.status, await r.json(), r.headers.get(BATCH_HEADER, "")

        return await asyncio.gather(*(one(i) for i in range(n)))


async def test_v1_callers_get_their_own_rows(env: Env) -> None:
    answers = await fire(env, 60, lambda i: {"instances": rows_of(i)}, "/v1/models/iris:predict")
    for i, (status, body, _) in enumerate(answers):
        assert status == 200, body
        assert body == {"predictions": env.model.predict(np.asarray(rows_of(i))).tolist()}
    sizes = [int(b.split("/")[1]) for _, _, b in answers]
    assert max(sizes) > 1, sizes  # 60 at once on one busy slot: batches formed


async def test_v2_callers_get_their_own_rows(env: Env) -> None:
    def body(i: int) -> dict[str, Any]:
        rows = rows_of(i)
        return {"inputs": [{"name": "input-0", "datatype": "FP32", "shape": [len(rows), 4],
                            "data": [x for r in rows for x in r]}]}  # fmt: skip

    answers = await fire(env, 60, body, "/v2/models/iris/infer")
    for i, (status, out, _) in enumerate(answers):
        assert status == 200, out
        want = env.model.predict(np.asarray(rows_of(i))).tolist()
        assert out["outputs"][0]["shape"][0] == len(want)
        assert out["outputs"][0]["data"] == want
    assert max(int(b.split("/")[1]) for _, _, b in answers) > 1


async def test_a_refused_batch_is_refused_to_each_caller(env: Env) -> None:
    # Every third caller sends rows of 2 features: the model refuses any
    # batch holding one, so each of that batch's callers gets its 400.
    def body(i: int) -> dict[str, Any]:
        return {"instances": [[1.0, 2.0]] if i % 3 == 1 else rows_of(i)}

    answers = await fire(env, 60, body, "/v1/models/iris:predict")
    batches: dict[str, list[int]] = defaultdict(list)
    for i, (_, _, b) in enumerate(answers):
        batches[b.split("/")[0]].append(i)
    for members in batches.values():
        bad = any(i % 3 == 1 for i in members)
        for i in members:
            status, out, _ = answers[i]
            assert status == (400 if bad else 200), (members, out)
            if bad:
                assert "instances" in out["error"]
    assert any(len(m) > 1 and any(i % 3 == 1 for i in m) for m in batches.values())
