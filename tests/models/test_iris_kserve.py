"""The iris classifier (scikit-learn, trained here from the data set
scikit-learn ships) deployed as a function under a real `galaxy up`: the
node agent fetches the model from a real HTTP store into its cache, and
clients we did not write call it through the gateway on KServe v1 (curl,
`requests`) and the Open Inference Protocol v2 (`tritonclient`, curl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import requests
import tritonclient.http as triton
import yaml

from scripts.train_iris import iris, train
from tests.integration.upctl import REPO, GalaxyUp
from tests.models.store import CountingStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: One row of each class from the data set, and two rows that are no row of it.
_ROWS = [0, 50, 100]
_NEW = [[6.8, 2.8, 4.8, 1.4], [5.0, 3.6, 1.3, 0.25]]


def test_iris_on_kserve_v1_and_v2_through_the_gateway(tmp_path: Path, monkeypatch) -> None:
    # The runtime runs `python3`: this interpreter's (scikit-learn, aiohttp).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    root = tmp_path / "store"
    sha, _ = train(root / "iris.joblib")
    expected = joblib.load(root / "iris.joblib")
    data = iris()
    rows = data.data[_ROWS].tolist() + _NEW
    want = expected.predict(np.asarray(rows)).tolist()
    assert want[:3] == data.target[_ROWS].tolist()  # the model classifies the classes apart
    store = CountingStore(root)
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        spec = yaml.safe_load((REPO / "examples" / "iris.yaml").read_text())
        spec["artifact"] = str(REPO / "examples" / spec["artifact"])
        spec["model"] = {"uri": store.url("iris.joblib"), "format": "sklearn", "sha256": sha}
        (tmp_path / "iris.yaml").write_text(yaml.safe_dump(spec))
        r = g.cli("deploy", "-f", str(tmp_path / "iris.yaml"))
        assert r.returncode == 0, r.stderr
        gw = f"http://{g.endpoints['gateway']}"

        # KServe v1 with curl (the first call is the cold start).
        out = subprocess.run(
            ["curl", "-sS", "--max-time", "90", "-w", "\n%{http_code}",
             f"{gw}/v1/models/iris:predict", "-H", "Content-Type: application/json",
             "-d", json.dumps({"instances": rows})],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        body, code = out.rsplit("\n", 1)
        assert code == "200", out
        assert json.loads(body) == {"predictions": want}
        # ... and with requests; a bad row is a 400 naming the field.
        resp = requests.post(f"{gw}/v1/models/iris:predict", json={"instances": rows}, timeout=30)
        assert resp.status_code == 200 and resp.json()["predictions"] == want
        resp = requests.post(
            f"{gw}/v1/models/iris:predict", json={"instances": [[1.0, 2.0]]}, timeout=30
        )
        assert resp.status_code == 400 and "instances" in resp.json()["error"]

        # Open Inference Protocol v2 with Triton's client.
        client = triton.InferenceServerClient(g.endpoints["gateway"], network_timeout=60)
        assert client.is_server_ready()
        assert client.is_model_ready("iris")
        meta = client.get_model_metadata("iris")
        assert meta["name"] == "iris" and meta["inputs"][0]["shape"] == [-1, 4]
        tensor = triton.InferInput("input-0", [len(rows), 4], "FP32")
        tensor.set_data_from_numpy(np.asarray(rows, dtype=np.float32), binary_data=False)
        result = client.infer(
            "iris", [tensor], outputs=[triton.InferRequestedOutput("output-0", binary_data=False)]
        )
        assert result.get_response()["model_name"] == "iris"
        assert result.as_numpy("output-0").tolist() == want
        # The versioned path (the gateway routes /v2/models/NAME/versions/V/...).
        result = client.infer("iris", [tensor], model_version="1")
        assert result.as_numpy("output-0").tolist() == want
        client.close()
        # ... and v2 with curl: a wrong datatype is a 400 naming the field.
        resp = requests.post(
            f"{gw}/v2/models/iris/infer",
            json={"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "STRING",
                              "data": ["a", "b", "c", "d"]}]},
            timeout=30,
        )  # fmt: skip
        assert resp.status_code == 400 and "inputs[0].datatype" in resp.json()["error"]
        out = subprocess.run(
            ["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}",
             f"{gw}/v2/models/iris/infer", "-d",
             json.dumps({"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32",
                                     "data": rows[1]}]})],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        body, code = out.rsplit("\n", 1)
        assert code == "200", out
        assert json.loads(body)["outputs"][0]["data"] == [want[1]]
        assert store.gets["/iris.joblib"] == 1  # the model came through the store and cache
    finally:
        g.stop()
        store.close()
