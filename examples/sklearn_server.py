"""A scikit-learn model server on the KServe protocols (one self-contained
file: it imports only third-party packages, so it runs in a sandbox that
shows the interpreter and this file and nothing else of the repository).

It loads the joblib file the node agent fetched into its model cache (the
path given as its first argument, else $GALAXY_MODEL_PATH) once at start and
serves it under the function's name ($GALAXY_FUNCTION, or --model-name):

  KServe v1:  GET  /v1/models/NAME            -> {"name", "ready"}
              POST /v1/models/NAME:predict    {"instances": [[f, ...], ...]}
                                              -> {"predictions": [...]}
  Open Inference Protocol v2 (JSON tensors; the binary extension is refused):
              GET  /v2/health/live, /v2/health/ready
              GET  /v2/models/NAME            -> metadata (inputs, outputs)
              GET  /v2/models/NAME/ready
              POST /v2/models/NAME/infer      {"inputs": [{"name", "shape",
                   "datatype": "FP32", "data"}]} -> {"model_name", "outputs"}
              (the last three also under /v2/models/NAME/versions/1)

Bad input gets 400 with an "error" naming the field; never the input back.

Run by hand: PORT=8080 python examples/sklearn_server.py /tmp/iris.joblib --model-name=iris
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from typing import Any

import joblib
import numpy as np
from aiohttp import web

#: The model's version on v2 (one file, one version).
VERSION = "1"
#: Rows in one request: a bound on the work (and memory) one request can ask for.
MAX_ROWS = 10_000
#: Request bodies above this are refused by aiohttp with 413.
MAX_BODY_BYTES = 4 << 20
#: Open Inference Protocol datatypes this server accepts as input.
_INPUT_TYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}


class BadRequest(Exception):
    """A client error; its message names the field."""


def _v2_type(array: np.ndarray) -> str:
    kind = {"f": "FP", "i": "INT", "u": "UINT", "b": "BOOL"}.get(array.dtype.kind)
    if kind is None:
        return "BYTES"
    return kind if kind == "BOOL" else f"{kind}{array.dtype.itemsize * 8}"


class Model:
    """The loaded estimator and what the protocols say about it."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.estimator = joblib.load(path)
        self.features = int(getattr(self.estimator, "n_features_in_", 0)) or None

    def rows(self, value: Any, field: str, dtype: type = np.float64) -> np.ndarray:
        """A 2-D array of numbers from a JSON list of rows, checked."""
        if not isinstance(value, list) or not value:
            raise BadRequest(f"{field}: a non-empty list of rows")
        if len(value) > MAX_ROWS:
            raise BadRequest(f"{field}: at most {MAX_ROWS} rows")
        try:
            array: np.ndarray = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError):
            raise BadRequest(f"{field}: rows of numbers, all of the same length") from None
        if array.ndim != 2:
            raise BadRequest(f"{field}: rows of numbers, all of the same length")
        if self.features is not None and array.shape[1] != self.features:
            raise BadRequest(f"{field}: each row has {self.features} numbers")
        return array

    def predict(self, rows: np.ndarray, field: str) -> np.ndarray:
        """The estimator's predictions; NaN and infinities are the client's error."""
        if not np.isfinite(rows).all():
            raise BadRequest(f"{field}: finite numbers")
        return np.asarray(self.estimator.predict(rows))

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [VERSION],
            "platform": "sklearn",
            "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, self.features or -1]}],
            "outputs": [{"name": "output-0", "datatype": "INT64", "shape": [-1]}],
        }


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("body: a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("body: a JSON object")
    return body


def _v2_inputs(model: Model, body: dict[str, Any]) -> np.ndarray:
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest("inputs: a list of one tensor")
    tensor = inputs[0]
    datatype = tensor.get("datatype")
    dtype = _INPUT_TYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise BadRequest(f"inputs[0].datatype: one of {', '.join(_INPUT_TYPES)}")
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(d, int) and d > 0 for d in shape)
    ):
        raise BadRequest("inputs[0].shape: [rows, features], two positive integers")
    if shape[0] > MAX_ROWS:
        raise BadRequest(f"inputs[0].shape: at most {MAX_ROWS} rows")
    data = tensor.get("data")
    if not isinstance(data, list):
        raise BadRequest("inputs[0].data: a list of numbers")
    try:
        flat = np.asarray(data, dtype=dtype).reshape(-1)
    except (TypeError, ValueError):
        raise BadRequest("inputs[0].data: a list of numbers") from None
    if flat.size != shape[0] * shape[1]:
        raise BadRequest("inputs[0].data: shape[0] * shape[1] numbers")
    if model.features is not None and shape[1] != model.features:
        raise BadRequest(f"inputs[0].shape: each row has {model.features} numbers")
    return flat.reshape(shape)


def make_app(model: Model) -> web.Application:
    """The HTTP application serving ``model`` on KServe v1 and v2."""
    routes = web.RouteTableDef()

    def check_name(request: web.Request) -> None:
        # The one version this server holds is "1" (v2's /versions/V paths).
        version = request.match_info.get("version", VERSION)
        if request.match_info["name"] != model.name or version != VERSION:
            raise web.HTTPNotFound(
                text=json.dumps({"error": "model not found"}), content_type="application/json"
            )

    @routes.get("/v2/health/live")
    @routes.get("/v2/health/ready")
    @routes.get("/healthz")
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"live": True, "ready": True})

    @routes.get("/v1/models/{name}")
    @routes.get("/v2/models/{name}/ready")
    @routes.get("/v2/models/{name}/versions/{version}/ready")
    async def ready(request: web.Request) -> web.Response:
        check_name(request)
        return web.json_response({"name": model.name, "ready": True})

    @routes.get("/v2/models/{name}")
    @routes.get("/v2/models/{name}/versions/{version}")
    async def metadata(request: web.Request) -> web.Response:
        check_name(request)
        return web.json_response(model.metadata())

    @routes.post("/v1/models/{name}:predict")
    async def predict_v1(request: web.Request) -> web.Response:
        check_name(request)
        body = await _json(request)
        rows = model.rows(body.get("instances"), "instances")
        return web.json_response({"predictions": model.predict(rows, "instances").tolist()})

    @routes.post("/v2/models/{name}/infer")
    @routes.post("/v2/models/{name}/versions/{version}/infer")
    async def infer_v2(request: web.Request) -> web.Response:
        check_name(request)
        if "Inference-Header-Content-Length" in request.headers:
            raise BadRequest("body: JSON tensors only (the binary data extension is not served)")
        body = await _json(request)
        request_id = body.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise BadRequest("id: a string")
        out = model.predict(_v2_inputs(model, body), "inputs[0].data")
        return web.json_response(
            {
                "model_name": model.name,
                "model_version": VERSION,
                "id": request_id or str(uuid.uuid4()),
                "outputs": [
                    {
                        "name": "output-0",
                        "shape": list(out.shape),
                        "datatype": _v2_type(out),
                        "data": out.reshape(-1).tolist(),
                    }
                ],
            }
        )

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as e:
            return web.json_response({"error": str(e)}, status=400)

    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes(routes)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_path", nargs="?", default=os.environ.get("GALAXY_MODEL_PATH", ""))
    p.add_argument("--model-name", default=os.environ.get("GALAXY_FUNCTION", "model"))
    args = p.parse_args()
    if not args.model_path:
        p.error("the model's path: an argument or $GALAXY_MODEL_PATH")
    model = Model(args.model_name, args.model_path)
    web.run_app(
        make_app(model),
        host=os.environ.get("HOST", "127.0.0.1"),
        port=int(os.environ["PORT"]),
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
