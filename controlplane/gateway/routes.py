"""Which function a gateway request is for, and the path it goes to on the
instance. Pure: no I/O (the proxy reads the body for the routes that name
the function in it).

Routes, first match wins (function; path on the instance):

- Host ``{name}.{domain}``, any path: name; the request path.
- ``/functions/{name}[/{rest}]``: name; ``/{rest}``.
- ``POST /graphs/{name}``: the inference graph ``name`` (kind ``graph``),
  run by the gateway (``controlplane/gateway/graphs``).
- ``/v1/models/{name}:predict`` and ``:explain`` (KServe v1): name; the
  request path.
- ``/v2/models/{name}[/versions/{v}][/infer|/ready]`` (Open Inference
  Protocol v2): name; the request path.
- ``POST /v1/chat/completions``, ``POST /v1/completions`` (OpenAI): the
  body's ``model``; the request path.

The gateway answers ``/v1/models`` (OpenAI's list), ``/v1/models/{name}``
(OpenAI's retrieve), ``/v2`` (the server's Open Inference Protocol
metadata), ``/v2/health/live``, ``/v2/health/ready`` and ``/healthz``
itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.gateway.guard import BadJson, parse_json
from controlplane.runtime.llmprompt import hint_blocks

#: DNS-1123 label: what a function name is (docs/architecture.md).
NAME = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAME_RE = re.compile(f"^{NAME}$")
_FUNCTIONS = re.compile(r"^/functions/(?P<name>[^/]+)(?P<rest>/.*)?$")
_GRAPHS = re.compile(r"^/graphs/(?P<name>[^/]+)$")
_KSERVE_V1 = re.compile(r"^/v1/models/(?P<name>[^/:]+):(predict|explain)$")
_OPENAI_MODEL = re.compile(r"^/v1/models/(?P<name>[^/:]+)$")
_OIP_V2 = re.compile(r"^/v2/models/(?P<name>[^/]+)(/versions/[^/]+)?(/infer|/ready)?$")
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")
LOCAL_PATHS = ("/v1/models", "/v2", "/v2/health/live", "/v2/health/ready", "/healthz")


class RouteError(ValueError):
    """The request names no function, or names it wrongly; ``status`` is the
    HTTP status to answer with and the message names the field."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Route:
    """Where a request goes."""

    #: label for metrics: host, functions, graph, kserve-v1, oip-v2, openai, model, local
    kind: str
    function: str = ""
    #: path (and query) to send to the instance
    path: str = "/"
    #: OpenAI routes: the prompt's leading block hashes, for the owner's LLM
    #: picker (``llmprompt.hint_blocks``); None on other routes
    blocks: tuple[str, ...] | None = None


def _short(s: str) -> str:
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _check_name(name: str, where: str) -> str:
    if not _NAME_RE.match(name):
        raise RouteError(
            f"{where}: {_short(name)} is not a function name (lower-case letters, digits "
            "and '-', at most 63)",
            status=404 if where != "model" else 400,
        )
    return name


def route(path: str, query: str, host: str, domain: str) -> Route:
    """The route of a request that does not need its body (everything but
    the OpenAI routes, which ``openai_route`` finishes)."""
    with_query = path + (f"?{query}" if query else "")
    hostname = host.split(":", 1)[0].lower()
    if domain and hostname.endswith("." + domain):
        label = hostname[: -len(domain) - 1]
        if label and "." not in label:
            return Route("host", _check_name(label, "Host"), with_query)
    if path in LOCAL_PATHS:
        return Route("local", "", path)
    m = _FUNCTIONS.match(path)
    if m:
        rest = m.group("rest") or "/"
        return Route(
            "functions",
            _check_name(m.group("name"), "path"),
            rest + (f"?{query}" if query else ""),
        )
    m = _GRAPHS.match(path)
    if m:  # function holds the graph's name
        return Route("graph", _check_name(m.group("name"), "path"), with_query)
    m = _KSERVE_V1.match(path)
    if m:
        return Route("kserve-v1", _check_name(m.group("name"), "path"), with_query)
    m = _OPENAI_MODEL.match(path)
    if m:  # OpenAI's models.retrieve: answered by the gateway
        return Route("model", _check_name(m.group("name"), "path"), path)
    m = _OIP_V2.match(path)
    if m:
        return Route("oip-v2", _check_name(m.group("name"), "path"), with_query)
    if path in OPENAI_PATHS:
        return Route("openai", "", with_query)
    raise RouteError(f"no route for path {_short(path)}", status=404)


def openai_route(r: Route, body: bytes | bytearray) -> Route:
    """The OpenAI route with its function: the JSON body's ``model`` field
    (the body parsed within ``guard.parse_json``'s depth limit)."""
    try:
        doc = parse_json(body)
    except BadJson as e:
        raise RouteError(f"{e}; must be a JSON object with a 'model' field") from None
    if not isinstance(doc, dict):
        raise RouteError("body: must be a JSON object with a 'model' field")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise RouteError("model: required (the name of the function to call)")
    return Route(r.kind, _check_name(model, "model"), r.path, hint_blocks(doc))


def tagged(r: Route) -> tuple[str, Route] | None:
    """For a Host route whose label is not a function: (tag, route to the
    function) when the label reads ``{tag}-{name}``, as Knative names a
    tagged revision's host; None otherwise."""
    if r.kind != "host" or "-" not in r.function:
        return None
    tag, name = r.function.split("-", 1)
    if not tag or not _NAME_RE.match(name):
        return None
    return tag, Route("host", name, r.path)
