"""Protocol details clients we did not write rely on: tritonclient's HTTP
client and the openai package through the gateway, the Open Inference
Protocol's error shape, CORS, and no header the caller did not send."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import make_mocked_request

from controlplane.gateway import cors
from controlplane.gateway.proxy import Proxy
from controlplane.runtime import authn
from tests.gateway.conftest import Gateway
from tests.gateway.test_gateway import curl


async def test_no_accept_encoding_is_added_for_the_instance(gw: Gateway) -> None:
    r = await curl(f"{gw.url}/functions/echo/headers")  # curl sends none without --compressed
    seen = {k.lower() for k in json.loads(r.stdout)["headers"]}
    assert "accept-encoding" not in seen and "host" in seen
    r = await curl("-H", "Accept-Encoding: br", f"{gw.url}/functions/echo/headers")
    sent = {k.lower(): v for k, v in json.loads(r.stdout)["headers"].items()}
    assert sent["accept-encoding"] == "br"  # what the caller sent goes through


async def test_v2_errors_have_the_open_inference_protocol_shape(gw: Gateway) -> None:
    r = await curl("-w", "\n%{http_code}", f"{gw.url}/v2/models/nope/infer", "-d", "{}")
    body, code = r.stdout.rsplit("\n", 1)
    assert code == "404"
    err = json.loads(body)["error"]
    assert isinstance(err, str) and "nope" in err
    r = await curl(f"{gw.url}/v2")
    assert json.loads(r.stdout)["name"] == "galaxy"


async def test_tritonclient_http_through_the_gateway(gw: Gateway) -> None:
    np = pytest.importorskip("numpy")
    http = pytest.importorskip("tritonclient.http")
    utils = pytest.importorskip("tritonclient.utils")

    def talk() -> tuple[bool, bool, str, list[float], str]:
        c = http.InferenceServerClient(url=gw.address)
        x = http.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32), binary_data=False)
        out = c.infer(
            "stream", [x], outputs=[http.InferRequestedOutput("output-0", binary_data=False)]
        )
        try:
            c.infer("nope", [x])
            missing = ""
        except utils.InferenceServerException as e:
            missing = e.message()
        return (c.is_server_live(), c.is_server_ready(), c.get_server_metadata()["name"],
                out.as_numpy("output-0").tolist(), missing)  # fmt: skip

    live, ready, name, data, missing = await asyncio.to_thread(talk)
    assert live and ready and name == "galaxy"
    assert data == [1.5, 2.5]
    assert "nope" in missing  # tritonclient read the OIP error's message


async def test_openai_models_retrieve(gw: Gateway) -> None:
    openai = pytest.importorskip("openai")

    def talk() -> tuple[str, str]:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-not-galaxy", max_retries=0)
        found = client.models.retrieve("echo").id
        try:
            client.models.retrieve("nope")
            missing = ""
        except openai.NotFoundError as e:
            missing = str(e)
        return found, missing

    found, missing = await asyncio.to_thread(talk)
    assert found == "echo" and "nope" in missing


async def test_cors_preflight_for_allowed_origins_only(gw: Gateway) -> None:
    pre = ["-X", "OPTIONS", "-H", "Access-Control-Request-Method: POST",
           "-H", "Access-Control-Request-Headers: content-type", "-i"]  # fmt: skip
    r = await curl(*pre, "-H", "Origin: https://app.example", f"{gw.url}/functions/echo")
    assert r.stdout.startswith("HTTP/1.1 403")  # closed by default
    gw.proxy.cors = cors.Cors("https://app.example")  # as --cors-origins sets it
    r = await curl(*pre, "-H", "Origin: https://app.example", f"{gw.url}/functions/echo")
    head = r.stdout.lower()
    assert r.stdout.startswith("HTTP/1.1 204")
    assert "access-control-allow-origin: https://app.example" in head
    assert "access-control-allow-headers: content-type" in head
    r = await curl(*pre, "-H", "Origin: https://other.example", f"{gw.url}/functions/echo")
    assert r.stdout.startswith("HTTP/1.1 403")
    r = await curl("-i", "-H", "Origin: https://app.example", f"{gw.url}/functions/echo", "-d", "x")
    assert "access-control-allow-origin: https://app.example" in r.stdout.lower()


def test_a_bearer_that_is_not_a_galaxy_token_is_anonymous(gw: Gateway) -> None:
    """The openai package always sends its API key: on a gateway that
    passes tokens on, a bearer that is not ``glx_...`` counts as no token
    (public functions answer it), a Galaxy token is passed on as it is."""
    p: Proxy = gw.proxy

    def token(header: str) -> str:
        return p._token(make_mocked_request("POST", "/", headers={"Authorization": header}))

    assert token("Bearer sk-proj-abc") == authn.ANONYMOUS
    assert token("Bearer glx_0123456789abcdef_s3cret") == "glx_0123456789abcdef_s3cret"
