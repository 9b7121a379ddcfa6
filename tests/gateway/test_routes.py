"""The gateway's routing rules (pure)."""

from __future__ import annotations

import pytest

from controlplane.gateway.routes import Route, RouteError, openai_route, route

D = "galaxy.local"


@pytest.mark.parametrize(
    "path, query, host, want",
    [
        ("/functions/echo", "", "gw:8080", Route("functions", "echo", "/")),
        ("/functions/echo/a/b", "x=1", "gw", Route("functions", "echo", "/a/b?x=1")),
        ("/anything", "q=2", "echo.galaxy.local:8080", Route("host", "echo", "/anything?q=2")),
        ("/v1/models/resnet:predict", "", "gw",
         Route("kserve-v1", "resnet", "/v1/models/resnet:predict")),
        ("/v2/models/resnet/infer", "", "gw", Route("oip-v2", "resnet", "/v2/models/resnet/infer")),
        ("/v2/models/resnet/versions/3/infer", "", "gw",
         Route("oip-v2", "resnet", "/v2/models/resnet/versions/3/infer")),
        ("/v2/models/resnet/ready", "", "gw", Route("oip-v2", "resnet", "/v2/models/resnet/ready")),
        ("/v1/chat/completions", "", "gw", Route("openai", "", "/v1/chat/completions")),
        ("/v1/models", "", "gw", Route("local", "", "/v1/models")),
        ("/v2/health/ready", "", "gw", Route("local", "", "/v2/health/ready")),
    ],
)  # fmt: skip
def test_routes(path: str, query: str, host: str, want: Route) -> None:
    assert route(path, query, host, D) == want


def test_host_routing_can_be_off_and_ignores_other_domains() -> None:
    assert route("/functions/a", "", "echo.galaxy.local", "").function == "a"
    assert route("/functions/a", "", "echo.example.com", D).function == "a"


@pytest.mark.parametrize(
    "path, status",
    [("/nowhere", 404), ("/functions/UPPER", 404), ("/functions/" + "x" * 300, 404)],
)
def test_bad_routes_name_the_problem_briefly(path: str, status: int) -> None:
    with pytest.raises(RouteError) as e:
        route(path, "", "gw", D)
    assert e.value.status == status and len(str(e.value)) < 200


@pytest.mark.parametrize(
    "body, field",
    [(b"not json", "body"), (b"[1]", "body"), (b"{}", "model"), (b'{"model": 3}', "model"),
     (b'{"model": "Bad Name"}', "model")],
)  # fmt: skip
def test_openai_body_needs_a_model(body: bytes, field: str) -> None:
    with pytest.raises(RouteError) as e:
        openai_route(Route("openai", "", "/v1/completions"), body)
    assert str(e.value).startswith(field) and e.value.status == 400


def test_openai_model_picks_the_function() -> None:
    r = openai_route(Route("openai", "", "/v1/chat/completions"), b'{"model": "llama"}')
    # (no prompt: no prefix blocks, but a hint all the same: the route is an LLM's)
    assert r == Route("openai", "llama", "/v1/chat/completions", ())
    words = " ".join(f"w{k}" for k in range(40))
    body = b'{"model": "llama", "prompt": "%s"}' % words.encode()
    with_prompt = openai_route(Route("openai", "", "/v1/completions"), body)
    assert with_prompt.blocks is not None and len(with_prompt.blocks) == 2  # 40 words: 2 blocks
