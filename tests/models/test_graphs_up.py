"""The iris Ensemble graph under a real `galaxy up --graphs-dir
examples/graphs` (every component a process, tokens on), called with curl:
the README's path for a graph, from deploy to answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import yaml
from sklearn.datasets import load_iris

from tests.integration.upctl import REPO, GalaxyUp
from tests.models.irisgw import example

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def test_iris_ensemble_graph_under_galaxy_up(tmp_path: Path, monkeypatch) -> None:
    # The runtimes run `python3`: this interpreter's (scikit-learn, aiohttp).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    docs = [example(n, tmp_path) for n in ("iris-prep", "iris", "iris-tree")]
    g = GalaxyUp(tmp_path / "run", "--nodes", "1", "--graphs-dir", str(REPO / "examples/graphs"))
    g.start()
    try:
        for d in docs:
            (tmp_path / f"{d['name']}.yaml").write_text(yaml.safe_dump(d))
            r = g.cli("deploy", "-f", str(tmp_path / f"{d['name']}.yaml"))
            assert r.returncode == 0, r.stderr
        rows = load_iris().data[[0, 50, 100]].tolist()
        body = {"instances": [dict(zip(NAMES, r, strict=True)) for r in rows]}
        token = (tmp_path / "run" / "token").read_text().strip()
        out = subprocess.run(
            ["curl", "-sS", "--max-time", "120", "-w", "\n%{http_code}",
             f"http://{g.endpoints['gateway']}/graphs/iris-ensemble",
             "-H", f"Authorization: Bearer {token}", "-d", json.dumps(body)],
            capture_output=True, text=True, timeout=150, check=True,
        ).stdout  # fmt: skip
        text, code = out.rsplit("\n", 1)
        assert code == "200", out
        x = np.asarray(rows)
        want = {
            name: {"predictions": joblib.load(d["model"]["uri"]).predict(x).tolist()}
            for name, d in (("logistic", docs[1]), ("tree", docs[2]))
        }
        assert json.loads(text) == want
    finally:
        g.stop()
