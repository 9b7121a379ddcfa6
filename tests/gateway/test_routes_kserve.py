"""Routes added for inference graphs and KServe v1 :explain (pure)."""

from __future__ import annotations

import pytest

from controlplane.gateway.routes import Route, RouteError, route


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/graphs/iris-ensemble", Route("graph", "iris-ensemble", "/graphs/iris-ensemble")),
        ("/v1/models/iris:explain", Route("kserve-v1", "iris", "/v1/models/iris:explain")),
        ("/v1/models/iris:predict", Route("kserve-v1", "iris", "/v1/models/iris:predict")),
    ],
)
def test_graph_and_explain_routes(path: str, want: Route) -> None:
    assert route(path, "", "gw", "") == want


@pytest.mark.parametrize("path", ["/graphs/Not_A_Name", "/graphs/a/b", "/v1/models/iris:train"])
def test_bad_graph_and_verb_paths_are_refused(path: str) -> None:
    with pytest.raises(RouteError) as e:
        route(path, "", "gw", "")
    assert e.value.status == 404
