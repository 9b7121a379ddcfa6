"""The iris Ensemble graph under a real `galaxy up` (every component a
process, tokens on): stored with `galaxy graphs apply`, called with curl
through the gateway, refused to a developer of another namespace, then
deleted and answered 404 once the gateway's cache bound has passed: the
README's path for a graph, from deploy to answer. (``--graphs-dir``:
tests/gateway/test_graphs.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import joblib
import numpy as np
import pytest
import yaml

from controlplane.gateway.graphs import source
from scripts.train_iris import iris
from tests.integration.upctl import REPO, GalaxyUp
from tests.models.irisgw import example

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def test_iris_ensemble_graph_under_galaxy_up(tmp_path: Path, monkeypatch) -> None:
    # The runtimes run `python3`: this interpreter's (scikit-learn, aiohttp).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    docs = [example(n, tmp_path) for n in ("iris-prep", "iris", "iris-tree")]
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        for d in docs:
            (tmp_path / f"{d['name']}.yaml").write_text(yaml.safe_dump(d))
            r = g.cli("deploy", "-f", str(tmp_path / f"{d['name']}.yaml"))
            assert r.returncode == 0, r.stderr
        r = g.cli("graphs", "apply", "-f", str(REPO / "examples/graphs/iris-ensemble.yaml"))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("graph iris-ensemble stored in namespace default"), r.stdout
        listed = json.loads(g.cli("graphs", "list", "-o", "json").stdout)
        assert [(x["name"], x["namespace"]) for x in listed] == [("iris-ensemble", "default")]
        rows = iris().data[[0, 50, 100]].tolist()
        body = {"instances": [dict(zip(NAMES, r, strict=True)) for r in rows]}
        token = (tmp_path / "run" / "token").read_text().strip()
        code, text = _post(g, token, body)
        assert code == "200", text
        x = np.asarray(rows)
        want = {
            name: {"predictions": joblib.load(d["model"]["uri"]).predict(x).tolist()}
            for name, d in (("logistic", docs[1]), ("tree", docs[2]))
        }
        assert json.loads(text) == want
        # A developer of another namespace may not run (or read) the graph.
        r = g.cli("tokens", "create", "other", "--role", "developer", "--namespace", "team-b",
                  "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        other = json.loads(r.stdout)["token"]
        code, text = _post(g, other, body)
        assert code == "403" and "namespace default" in text, text
        # Deleted: 404 once the gateway's cache has let it go (bounded poll).
        r = g.cli("graphs", "delete", "iris-ensemble")
        assert r.returncode == 0, r.stderr
        deleted = time.monotonic()
        while (code := _post(g, token, body)[0]) == "200":
            assert time.monotonic() - deleted < source.TTL_S + 10, "still served"
            time.sleep(0.2)
        assert code == "404"
        r = g.cli("graphs", "get", "iris-ensemble")
        assert r.returncode != 0 and "not found" in r.stderr
    finally:
        g.stop()


def _post(g: GalaxyUp, token: str, body: object) -> tuple[str, str]:
    """(HTTP status, body) of the iris-ensemble graph called with curl."""
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "120", "-w", "\n%{http_code}",
         f"http://{g.endpoints['gateway']}/graphs/iris-ensemble",
         "-H", f"Authorization: Bearer {token}", "-d", json.dumps(body)],
        capture_output=True, text=True, timeout=150, check=True,
    ).stdout  # fmt: skip
    text, code = out.rsplit("\n", 1)
    return code, text
