"""The inference graph examples (examples/graphs/) on the iris functions:
real preprocessing and scikit-learn server processes behind a real gateway,
called with curl."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import joblib
import numpy as np
import pytest
import pytest_asyncio

from controlplane.gateway.config import GatewayConfig
from scripts.train_iris import iris
from tests.gateway.test_gateway import curl
from tests.models.irisgw import EXAMPLES, example, serving

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

NAMES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


@dataclass
class Env:
    url: str
    logistic: Any
    tree: Any


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("iris-graphs")
    docs = [example(n, tmp) for n in ("iris-prep", "iris", "iris-tree")]
    cfg = GatewayConfig(request_timeout_s=60.0, graphs_dir=str(EXAMPLES / "graphs"))
    async with serving(tmp, cfg, docs) as url:
        models = [joblib.load(d["model"]["uri"]) for d in docs[1:]]
        yield Env(url, *models)


def named(rows: list[list[float]]) -> list[dict[str, float]]:
    return [dict(zip(NAMES, r, strict=True)) for r in rows]


def disagreeing(env: Env) -> list[list[float]]:
    """Rows of the data set the two classifiers label differently."""
    x = iris().data
    rows = x[env.logistic.predict(x) != env.tree.predict(x)].tolist()
    assert rows, "the two classifiers agree everywhere: the test could not tell them apart"
    return rows[:1]


async def call(env: Env, graph: str, body: Any) -> tuple[int, Any]:
    r = await curl("-w", "\n%{http_code}", f"{env.url}/graphs/{graph}", "-H",
                   "Content-Type: application/json", "-d", json.dumps(body), max_s=90)  # fmt: skip
    assert r.returncode == 0, r.stderr
    text, code = r.stdout.rsplit("\n", 1)
    return int(code), json.loads(text)


async def test_ensemble_of_two_classifiers_after_preprocessing(env: Env) -> None:
    rows = iris().data[[0, 50, 100]].tolist() + disagreeing(env)
    code, out = await call(env, "iris-ensemble", {"instances": named(rows)})
    assert code == 200, out
    x = np.asarray(rows)
    assert out == {
        "logistic": {"predictions": env.logistic.predict(x).tolist()},
        "tree": {"predictions": env.tree.predict(x).tolist()},
    }
    # Millimetres are converted by the preprocessing step.
    mm = [dict(r, unit="mm") | {k: r[k] * 10 for k in NAMES} for r in named(rows)]
    assert (await call(env, "iris-ensemble", {"instances": mm}))[1] == out


async def test_switch_picks_the_classifier_the_body_asks_for(env: Env) -> None:
    rows = disagreeing(env)
    x = np.asarray(rows)
    code, out = await call(env, "iris-switch", {"prefer": "tree", "instances": named(rows)})
    assert code == 200 and out["predictions"] == env.tree.predict(x).tolist(), out
    code, out = await call(env, "iris-switch", {"instances": named(rows)})
    assert code == 200 and out["predictions"] == env.logistic.predict(x).tolist(), out


async def test_splitter_sends_a_tenth_to_the_tree(env: Env) -> None:
    rows = disagreeing(env)
    tree = env.tree.predict(np.asarray(rows)).tolist()
    n = 200
    answers = []
    for _ in range(n // 20):
        answers += await asyncio.gather(
            *(call(env, "iris-splitter", {"instances": named(rows)}) for _ in range(20))
        )
    assert all(code == 200 for code, _ in answers)
    to_tree = sum(out["predictions"] == tree for _, out in answers)
    # Binomial(200, 0.1): mean 20, sd 4.2; outside [3, 40] has probability
    # below 1e-6 for a splitter that honours the weights.
    assert 3 <= to_tree <= 40, to_tree


async def test_a_refusing_step_names_itself(env: Env) -> None:
    bad = named(iris().data[:1].tolist())
    del bad[0]["petal_width"]
    code, out = await call(env, "iris-ensemble", {"instances": bad})
    assert code == 400, out
    err = out["error"]
    assert (err["step"], err["function"]) == ("root.prep", "iris-prep")
    assert "instances[0].petal_width" in err["message"]
