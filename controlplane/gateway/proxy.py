"""The gateway's request handler: route, get a slot, proxy, stream back,
release. Errors become JSON answers with a status a client can act on."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from controlplane.gateway import routes
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.slots import SlotCache
from controlplane.runtime import access, authn
from controlplane.runtime.errors import GalaxyError, NotFound, Unauthenticated
from controlplane.sdk.client import GalaxyClient

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "galaxy_gateway_requests_total",
    "Gateway requests by route kind and HTTP status",
    ["route", "code"],
)
LATENCY = Histogram(
    "galaxy_gateway_request_seconds",
    "Gateway request time to the last byte, by route kind",
    ["route"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 300),
)
IN_FLIGHT = Gauge("galaxy_gateway_in_flight", "Requests being proxied now")
SHED = Counter("galaxy_gateway_shed_total", "Requests shed because the gateway was full")

#: Hop-by-hop headers (RFC 9110 section 7.6.1) are not forwarded either way.
#: Request header naming a traffic tag (see docs/gateway.md, revisions).
TAG_HEADER = "Galaxy-Revision-Tag"
HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)  # fmt: skip

#: Answers with a Content-Length up to this are read whole and sent in one
#: write; longer ones, and those without (chunked, server-sent events), are
#: streamed as they come.
SMALL_BODY_BYTES = 64 * 1024

#: gRPC status -> HTTP status of the gateway's answer.
HTTP_OF: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.FAILED_PRECONDITION: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
}


def error(status: int, message: str, cfg: GatewayConfig, kind: str = "") -> web.Response:
    """A JSON error in the shape OpenAI clients read (``error.message``)."""
    headers = {}
    if status in (429, 503):
        headers["Retry-After"] = str(cfg.retry_after_s)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="galaxy"'
    body = {"error": {"message": message[:512], "code": status, "type": kind or "gateway_error"}}
    return web.json_response(body, status=status, headers=headers)


class Proxy:
    """The handler of every route, with the SDK client it dispatches through."""

    def __init__(
        self, client: GalaxyClient, cfg: GatewayConfig, *, require_token: bool = False
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.require_token = require_token
        self.slots = SlotCache(client, cfg)
        self.in_flight = 0
        self._models: tuple[float, list[dict[str, Any]]] = (0.0, [])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Route, proxy and account for one request."""
        start = time.perf_counter()
        kind = "unrouted"
        resp: web.StreamResponse
        try:
            r = routes.route(
                request.path, request.query_string, request.headers.get("Host", ""), self.cfg.domain
            )
            kind = r.kind
            token = self._token(request) if self.require_token and not _health(r) else None
            if r.kind == "local":
                resp = await self._local(request, r, token)
            else:
                resp = await self._proxied(request, r, token)
        except routes.RouteError as e:
            resp = error(e.status, str(e), self.cfg, "invalid_request_error")
        except GalaxyError as e:
            resp = error(HTTP_OF.get(e.code, 502), e.message, self.cfg, e.code.name.lower())
        REQUESTS.labels(kind, str(resp.status)).inc()
        LATENCY.labels(kind).observe(time.perf_counter() - start)
        return resp

    def _token(self, request: web.Request) -> str:
        """The caller's bearer token, or ``authn.ANONYMOUS`` without an
        Authorization header (a public function answers it; Dispatch says
        401 for any other); 401 at once for a header that is not a bearer
        token. The control plane judges the token: the gateway passes it on."""
        header = request.headers.get("Authorization")
        if header is None:
            return authn.ANONYMOUS
        token = access.bearer(header)
        if token is None:
            raise Unauthenticated("Authorization: a bearer token is required (Bearer glx_...)")
        return token

    async def _proxied(
        self, request: web.Request, r: routes.Route, token: str | None
    ) -> web.StreamResponse:
        if self.in_flight >= self.cfg.max_in_flight:
            SHED.inc()
            return error(503, "gateway at capacity; retry", self.cfg, "overloaded")
        if request.content_length and request.content_length > self.cfg.max_body_bytes:
            return error(413, f"body: larger than {self.cfg.max_body_bytes} bytes", self.cfg)
        body = await request.read()
        if r.kind == "openai":
            r = routes.openai_route(r, body)
        # The caller's Galaxy token is for the control plane, never for the
        # function's code.
        strip = HOP | {"authorization"} if self.require_token else HOP
        headers = {k: v for k, v in request.headers.items() if k.lower() not in strip}
        headers["X-Forwarded-Host"] = request.headers.get("Host", "")
        # A traffic tag pins a revision (canary testing before it gets a share).
        tag = request.headers.get(TAG_HEADER, "")
        self.in_flight += 1
        IN_FLIGHT.inc()
        try:
            try:
                return await self._serve(request, r, body, headers, tag, token)
            except NotFound as not_found:
                # Host {tag}-{name}.{domain}, as Knative names tagged routes:
                # tried only once the whole label is known not to be a function.
                alt = None if tag else routes.tagged(r)
                if alt is None:
                    raise
                try:
                    return await self._serve(request, alt[1], body, headers, alt[0], token)
                except NotFound:
                    raise not_found from None  # about the name the client sent
        finally:
            self.in_flight -= 1
            IN_FLIGHT.dec()

    async def _serve(
        self,
        request: web.Request,
        r: routes.Route,
        body: bytes,
        headers: dict[str, str],
        tag: str,
        token: str | None,
    ) -> web.StreamResponse:
        """Get a slot, proxy the request, stream the answer back."""
        async with self.slots.slot(
            r.function, r.path, body, headers, request.method, tag, token
        ) as (slot, upstream):
            addr = slot.addr
            if upstream is None:  # an emulated sandbox: no process to call
                return web.json_response(
                    {"echo": body.decode("utf-8", "replace"), "emulated": addr.address}
                )
            length = upstream.content_length
            out: web.StreamResponse
            if length is not None and length <= SMALL_BODY_BYTES and request.method != "HEAD":
                # A small answer of known length leaves in one write with its
                # headers (fewer system calls than headers, chunk, end), once
                # read whole: nothing is being streamed.
                out = web.Response(
                    status=upstream.status, reason=upstream.reason, body=await upstream.read()
                )
            else:
                out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP:
                    out.headers.add(k, v)
            out.headers["X-Galaxy-Instance"] = addr.instance_id
            out.headers["X-Galaxy-Revision"] = addr.function
            if isinstance(out, web.Response):
                slot.reusable = True  # the instance's answer is all here
                return out
            await out.prepare(request)
            # Chunk by chunk as the instance produces them: streaming and
            # server-sent events reach the client without buffering.
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            slot.reusable = True  # the whole answer went out: keep the slot
            return out

    async def _local(
        self, request: web.Request, r: routes.Route, token: str | None
    ) -> web.StreamResponse:
        if r.path in ("/v2/health/live", "/healthz"):
            return web.json_response({"live": True})
        if r.path == "/v2/health/ready":
            try:
                # A probe answers now: no retrying while controllers fail over.
                await self.client.refresh_membership(retry_s=0)
            except GalaxyError as e:
                return error(503, f"control plane not reachable: {e.message}", self.cfg)
            return web.json_response({"ready": True})
        # /v1/models: OpenAI's list of models = the deployed functions (the
        # caller's, with tokens: nothing shared between callers then).
        if token is not None:
            fns = await self.client.list_functions(token)
            return web.json_response({"object": "list", "data": [_model(f) for f in fns]})
        now = time.monotonic()
        if now - self._models[0] > 1.0:
            fns = await self.client.list_functions()
            self._models = (
                now,
                [_model(f) for f in fns],
            )
        return web.Response(
            text=json.dumps({"object": "list", "data": self._models[1]}),
            content_type="application/json",
        )


def _health(r: routes.Route) -> bool:
    """Health checks answer without a token (probes hold none)."""
    return r.kind == "local" and r.path in ("/v2/health/live", "/v2/health/ready", "/healthz")


def _model(f: Any) -> dict[str, Any]:
    """One function as an OpenAI model entry."""
    return {"id": f.name, "object": "model", "created": 0, "owned_by": f.namespace or "galaxy"}
