"""Gateway routing under arbitrary input (hypothesis): any path, query, Host
and body gives a route or a RouteError with a 4xx status and a short
message, never another exception and never an echo of the whole input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.gateway import routes

TEXT = st.text(max_size=300)
PATHS = st.one_of(
    TEXT,
    st.builds(lambda n, r: f"/functions/{n}{r}", TEXT, TEXT),
    st.builds(lambda n: f"/v1/models/{n}:predict", TEXT),
    st.builds(lambda n: f"/v2/models/{n}/infer", TEXT),
    st.sampled_from(routes.OPENAI_PATHS + routes.LOCAL_PATHS),
)
HOSTS = st.one_of(TEXT, st.builds(lambda n: f"{n}.galaxy.local", TEXT))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(path=PATHS, query=TEXT, host=HOSTS, body=st.binary(max_size=400))
def test_any_request_routes_or_fails_cleanly(path: str, query: str, host: str, body: bytes) -> None:
    try:
        r = routes.route(path, query, host, "galaxy.local")
        if r.kind == "openai":
            r = routes.openai_route(r, body)
    except routes.RouteError as e:
        assert 400 <= e.status < 500
        assert len(str(e)) < 300  # names the field, never the whole input
        return
    assert r.kind in {"host", "functions", "kserve-v1", "oip-v2", "openai", "model", "local"}
    if r.kind != "local":
        assert routes._NAME_RE.match(r.function)
    alt = routes.tagged(r)
    if alt is not None:
        tag, to = alt
        assert tag and to.function and f"{tag}-{to.function}" == r.function


def test_tagged_reads_tag_dash_name_on_host_routes_only() -> None:
    host = routes.Route("host", "canary-my-fn", "/x")
    assert routes.tagged(host) == ("canary", routes.Route("host", "my-fn", "/x"))
    assert routes.tagged(routes.Route("host", "plain", "/")) is None
    assert routes.tagged(routes.Route("functions", "canary-my-fn", "/")) is None
