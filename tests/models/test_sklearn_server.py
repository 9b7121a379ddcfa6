"""The KServe model server (examples/sklearn_server.py) alone, as a real
subprocess on a real socket, with the iris model trained here: what it
answers to bad input (400 naming the field, never the input, never a
traceback) and to a model name it does not serve."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import requests

from scripts.train_iris import iris, train
from tests.integration.upctl import REPO

_ROW = [6.8, 2.8, 4.8, 1.4]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("iris") / "iris.joblib"
    train(path)
    return path


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[str]:
    model = model_path
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "sklearn_server.py"), str(model),
         "--model-name=iris"],
        env={"PORT": str(port), "HOST": "127.0.0.1"},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        # Polled: the server signals readiness only by answering (as to Galaxy).
        while True:
            try:
                requests.get(f"{url}/v2/health/ready", timeout=1)
                break
            except requests.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        assert "Traceback" not in err, err


def test_v1_and_v2_answer_what_the_model_predicts(server: str, model_path: Path) -> None:
    rows = iris().data
    want = joblib.load(model_path).predict(rows).tolist()
    assert len(set(want)) == 3  # all three classes: a constant answer would fail
    r = requests.post(
        f"{server}/v1/models/iris:predict", json={"instances": rows.tolist()}, timeout=30
    )
    assert r.status_code == 200 and r.json() == {"predictions": want}
    body = _v2(rows.astype(np.float32).reshape(-1).tolist(), shape=rows.shape)
    r = requests.post(f"{server}/v2/models/iris/infer", json={**body, "id": "req-1"}, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["model_name"] == "iris" and got["id"] == "req-1"
    assert got["outputs"] == [
        {"name": "output-0", "shape": [len(want)], "datatype": "INT64", "data": want}
    ]


def _v2(data: object, shape: object = (1, 4), datatype: object = "FP32") -> dict:
    shape = list(shape) if isinstance(shape, tuple) else shape
    return {"inputs": [{"name": "input-0", "shape": shape, "datatype": datatype, "data": data}]}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/models/iris:predict", {}, "instances"),
        ("/v1/models/iris:predict", {"instances": []}, "instances"),
        ("/v1/models/iris:predict", {"instances": [[1, 2]]}, "instances"),
        ("/v1/models/iris:predict", {"instances": [[1, 2, 3, "x"]]}, "instances"),
        ("/v1/models/iris:predict", {"instances": [[1, 2, 3, 4], [1]]}, "instances"),
        ("/v1/models/iris:predict", {"instances": [_ROW] * 10_001}, "instances"),
        ("/v1/models/iris:predict", [_ROW], "body"),
        ("/v2/models/iris/infer", {"inputs": []}, "inputs"),
        ("/v2/models/iris/infer", _v2(_ROW, datatype="BYTES"), "inputs[0].datatype"),
        ("/v2/models/iris/infer", _v2(_ROW, shape=(4,)), "inputs[0].shape"),
        ("/v2/models/iris/infer", _v2(_ROW, shape=(2, 2)), "inputs[0].shape"),
        ("/v2/models/iris/infer", _v2(_ROW, shape=(2, 4)), "inputs[0].data"),
        ("/v2/models/iris/infer", _v2("abcd"), "inputs[0].data"),
        ("/v2/models/iris/infer", _v2([1, 2, 3, "x"]), "inputs[0].data"),
        ("/v2/models/iris/infer", {**_v2(_ROW), "id": 7}, "id"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server: str, path: str, body: Any, field: str) -> None:
    r = requests.post(server + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith(field + ":"), error
    assert len(r.content) < 200  # the field, not the input


def test_nan_and_bad_json_and_binary_tensors_are_refused(server: str) -> None:
    # json.dumps writes NaN, which Python's parser (the server's) accepts.
    r = requests.post(
        f"{server}/v1/models/iris:predict", data='{"instances": [[NaN, 1, 2, 3]]}', timeout=30
    )
    assert r.status_code == 400 and r.json()["error"] == "instances: finite numbers"
    r = requests.post(f"{server}/v2/models/iris/infer", data="{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"].startswith("body:")
    r = requests.post(
        f"{server}/v2/models/iris/infer",
        data=b"{}",
        headers={"Inference-Header-Content-Length": "2"},
        timeout=30,
    )
    assert r.status_code == 400 and "binary" in r.json()["error"]


def test_a_model_it_does_not_serve_is_a_404(server: str) -> None:
    assert requests.get(f"{server}/v2/models/other", timeout=30).status_code == 404
    assert requests.get(f"{server}/v2/models/other/ready", timeout=30).status_code == 404
    assert requests.get(f"{server}/v2/models/iris/versions/2", timeout=30).status_code == 404
    r = requests.get(f"{server}/v2/models/iris/versions/1/ready", timeout=30)
    assert r.status_code == 200 and r.json()["ready"] is True
    r = requests.post(f"{server}/v1/models/other:predict", json={"instances": [_ROW]}, timeout=30)
    assert r.status_code == 404
    assert requests.get(f"{server}/v1/models/iris", timeout=30).json() == {
        "name": "iris",
        "ready": True,
    }
