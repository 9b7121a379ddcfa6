"""The gateway's request handler: route, get a slot, proxy, stream back,
release. Errors become JSON answers with a status a client can act on."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from controlplane.gateway import cors, guard, routes
from controlplane.gateway.batcher import Batcher
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.conns import Connections
from controlplane.gateway.graphs import runner as graphs_runner
from controlplane.gateway.graphs.runner import GraphRunner
from controlplane.gateway.graphs.source import GraphSource
from controlplane.gateway.pd import Disaggregation
from controlplane.gateway.slots import SlotCache
from controlplane.runtime import access, authn, fnmetrics, sloclass
from controlplane.runtime.errors import GalaxyError, NotFound, Unauthenticated
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import dispatch_pb2

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
CLIENT_GONE = Counter(
    "galaxy_gateway_client_gone_total",
    "Streamed answers cut short because the client closed its connection",
)

#: Hop-by-hop headers (RFC 9110 section 7.6.1) are not forwarded either way.
#: Request header naming a traffic tag (see docs/gateway.md, revisions).
TAG_HEADER = "Galaxy-Revision-Tag"
HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
        "Galaxy-Lease",  # the gateway's own proof for the node's entry, never a caller's
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


def error(
    status: int, message: str, cfg: GatewayConfig, kind: str = "", oip: bool = False
) -> web.Response:
    """A JSON error in the shape the route's clients read: OpenAI's
    (``error.message``), or for ``/v2`` the Open Inference Protocol's
    (``{"error": "..."}``, what KServe v2 and Triton clients read)."""
    headers = {}
    if status in (429, 503):
        headers["Retry-After"] = str(cfg.retry_after_s)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="galaxy"'
    text = message[:512]
    body: dict[str, Any] = (
        {"error": text}
        if oip
        else {"error": {"message": text, "code": status, "type": kind or "gateway_error"}}
    )
    return web.json_response(body, status=status, headers=headers)


class Refused(Exception):
    """A request the gateway refuses itself: status, reason (the metric's
    label) and a message naming what was wrong."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Body:
    """A request's body, read once when first wanted, within the upload
    budget, the size bound and the body deadline."""

    def __init__(self, request: web.Request, proxy: Proxy) -> None:
        self.request = request
        self.proxy = proxy
        self.data: bytes | bytearray | None = None
        self.taken = 0

    async def read(self, parsed: bool = False) -> bytes | bytearray:
        """The whole body (Refused when a bound is passed). Its bytes count
        against the upload budget until the request ends (``done``): twice
        when it is parsed as JSON (the parser copies a bytearray) or its
        length is unknown (aiohttp's ``read()`` joins its chunks into a
        copy), so the budget bounds what bodies really hold."""
        if self.data is not None:
            return self.data
        cfg, req = self.proxy.cfg, self.request
        length = req.content_length
        if length is not None and length > cfg.max_body_bytes:
            raise Refused(413, "body_size", f"body: larger than {cfg.max_body_bytes} bytes")
        copies = 2 if parsed or length is None else 1
        want = (cfg.max_body_bytes if length is None else length) * copies
        if want and req.body_exists:
            if not self.proxy.uploads.take(want):
                raise Refused(503, "upload_bytes", "gateway holding too many bodies; retry")
            self.taken = want
        try:
            try:
                async with asyncio.timeout(cfg.body_timeout_s):
                    self.data = await (req.read() if length is None else _read_exactly(req, length))
            except TimeoutError:
                raise Refused(
                    408, "body_timeout", f"body: not received within {cfg.body_timeout_s:g}s"
                ) from None
            except web.HTTPRequestEntityTooLarge:
                raise Refused(
                    413, "body_size", f"body: larger than {cfg.max_body_bytes} bytes"
                ) from None
        except BaseException:
            self.done()
            raise
        return self.data

    def done(self) -> None:
        """Give back the upload budget taken (idempotent)."""
        if self.taken:
            self.proxy.uploads.give(self.taken)
            self.taken = 0


async def _read_exactly(request: web.Request, length: int) -> bytearray:
    """A body of known length, into one buffer of that size as it comes:
    at most the body and one chunk in memory (``read()`` holds its chunks
    and their joined copy at once, twice the budget taken for it)."""
    buf = bytearray(length)
    pos = 0
    async for chunk in request.content.iter_any():
        buf[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    # aiohttp's parser ends the body at Content-Length: a shorter one is a
    # client that went away, answered as aiohttp answers a short read.
    if pos != length:
        raise web.HTTPBadRequest(text="body: shorter than Content-Length")
    return buf  # bytes-like: sent upstream as it is, no copy


#: The access log: one line per request (``--no-access-log`` turns it off).
ACCESS = logging.getLogger("galaxy.access")
#: Request key: (namespace, function, revision) of the slot that served it.
#: A typed key where aiohttp has them (3.14+; a plain string key warns there).
_SERVED: Any = (
    web.RequestKey("galaxy_served", tuple)
    if hasattr(web, "RequestKey")
    else "galaxy_served"  # (aiohttp before 3.14)
)


class Proxy:
    """The handler of every route, with the SDK client it dispatches through."""

    def __init__(
        self, client: GalaxyClient, cfg: GatewayConfig, *, require_token: bool = False
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.require_token = require_token
        self.slots = SlotCache(client, cfg)
        self.batcher = Batcher(client, self.slots, cfg)
        files = graphs_runner.load_dir(cfg.graphs_dir) if cfg.graphs_dir else {}
        self.graphs = GraphRunner(self.slots, cfg, GraphSource(client, files))
        self.pd = Disaggregation(client)
        self.in_flight = 0
        self._models: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self.refusals = guard.Refusals()
        self.uploads = guard.UploadBudget(cfg.max_upload_bytes)
        self.cors = cors.Cors(cfg.cors_origins)
        #: Per-function requests and latency (slot-cache hits included).
        self.functions = fnmetrics.FunctionMetrics("gateway")
        #: set by main.start: marks a connection busy while its handler runs
        self.connections: Connections | None = None
        #: the listening server (main.start)
        self.server: asyncio.Server | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Route, proxy and account for one request."""
        conns = self.connections
        if conns is not None:
            conns.started(request.transport)
        try:
            return await self._handle(request)
        finally:
            if conns is not None:
                conns.ended(request.transport)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        kind = "unrouted"
        resp: web.StreamResponse
        oip = request.path == "/v2" or request.path.startswith("/v2/")
        body = Body(request, self)
        try:
            if request.method == "OPTIONS" and cors.is_preflight(request.headers):
                kind = "preflight"
                resp = self.cors.preflight(request.headers)
            else:
                r = routes.route(
                    request.path,
                    request.query_string,
                    request.headers.get("Host", ""),
                    self.cfg.domain,
                )
                kind = r.kind
                # Before the body: a request without a usable token or
                # route is answered without reading it.
                token = self._token(request) if self.require_token and not _health(r) else None
                if r.kind in ("local", "model"):
                    resp = await self._local(request, r, token)
                else:
                    resp = await self._proxied(request, r, token, body)
        except routes.RouteError as e:
            self.refusals.refuse("route", request.remote or "", request.path[:80], str(e))
            resp = error(e.status, str(e), self.cfg, "invalid_request_error", oip)
        except Refused as e:
            self.refusals.refuse(e.reason, request.remote or "", request.path[:80], str(e))
            resp = error(e.status, str(e), self.cfg, e.reason, oip)
        except GalaxyError as e:
            status = HTTP_OF.get(e.code, 502)
            if status < 500:  # the control plane refused it (no such function, a token)
                self.refusals.refuse(
                    e.code.name.lower(), request.remote or "", request.path[:80], e.message
                )
            resp = error(status, e.message, self.cfg, e.code.name.lower(), oip)
        finally:
            body.done()
        if not resp.prepared:
            self.cors.decorate(request.headers, resp.headers)
        took = time.perf_counter() - start
        REQUESTS.labels(kind, str(resp.status)).inc()
        LATENCY.labels(kind).observe(took)
        served = request.get(_SERVED)
        if served is not None:  # a function's request (a slot was granted)
            ns, fn, rev = served
            self.functions.gateway_request(ns, fn, rev, resp.status, took)
        if self.cfg.access_log:
            self._access(request, kind, resp.status, took, served)
        return resp

    def _access(
        self,
        request: web.Request,
        kind: str,
        status: int,
        took: float,
        served: tuple[str, str, str] | None,
    ) -> None:
        """The access log line (JSON fields with --log-format json)."""
        extra: dict[str, object] = {
            "method": request.method,
            "path": request.path[:200],
            "status": status,
            "route": kind,
            "duration_ms": round(took * 1000, 3),
            "remote": request.remote or "",
            "request_id": request.headers.get("X-Request-Id", "")[:64],
        }
        if served is not None:
            extra |= {"namespace": served[0], "function": served[1], "revision": served[2]}
        ACCESS.info("%s %s %d %.1fms", request.method, request.path[:200], status,
                    took * 1000, extra=extra)  # fmt: skip

    def _token(self, request: web.Request) -> str:
        """The caller's Galaxy bearer token, or ``authn.ANONYMOUS`` without
        one: no Authorization header, or a bearer that is not a Galaxy token
        (``glx_...``; the ``openai`` package always sends its API key), which
        a public function answers and Dispatch refuses (401) for any other.
        401 at once for a header that is not a bearer token. The control
        plane judges the token: the gateway passes it on."""
        header = request.headers.get("Authorization")
        if header is None:
            return authn.ANONYMOUS
        token = access.bearer(header)
        if token is None:
            raise Unauthenticated("Authorization: a bearer token is required (Bearer glx_...)")
        return token if token.startswith(access.TOKEN_PREFIX) else authn.ANONYMOUS

    async def _proxied(
        self, request: web.Request, r: routes.Route, token: str | None, body: Body
    ) -> web.StreamResponse:
        if self.in_flight >= self.cfg.max_in_flight:
            SHED.inc()
            raise Refused(503, "in_flight", "gateway at capacity; retry")
        if request.content_length and request.content_length > self.cfg.max_body_bytes:
            raise Refused(413, "body_size", f"body: larger than {self.cfg.max_body_bytes} bytes")
        if r.kind == "openai":
            # The function is named in the body: read it now (bounded).
            r = routes.openai_route(r, await body.read(parsed=True))
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
            if r.kind == "graph":
                if request.method != "POST":
                    raise Refused(405, "method", "method: a graph is called with POST")
                return await self.graphs.run(r.function, await body.read(parsed=True), headers,
                                             token)  # fmt: skip
            if request.method == "POST":
                batched = await self.batcher.maybe(
                    r.kind, r.function, r.path, lambda: body.read(parsed=True), tag, token
                )
                if batched is not None:
                    return batched
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
        body: Body,
        headers: dict[str, str],
        tag: str,
        token: str | None,
    ) -> web.StreamResponse:
        """Get a slot, proxy the request, stream the answer back."""
        hint = None if r.blocks is None else dispatch_pb2.RoutingHint(prefix_blocks=r.blocks)
        # An OpenAI request to a disaggregated LLM is prefilled elsewhere first (pd.py).
        prepare = None if hint is None else self.pd.prepare(token)
        cls = request.headers.get(sloclass.HEADER)
        if cls is not None:  # an SLO class: Dispatch sheds the lowest first at overload
            try:
                priority = sloclass.parse(cls)
            except ValueError as e:
                raise Refused(400, "priority", str(e)) from None
            hint = hint or dispatch_pb2.RoutingHint()
            hint.priority = priority
        async with self.slots.slot(
            r.function, r.path, body.read, headers, request.method, tag, token, hint, prepare
        ) as (slot, upstream):
            addr = slot.addr
            request[_SERVED] = (addr.namespace, r.function, addr.function)
            if upstream is None:  # an emulated sandbox: no process to call
                data = await body.read()
                return web.json_response(
                    {"echo": data.decode("utf-8", "replace"), "emulated": addr.address}
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
            self.cors.decorate(request.headers, out.headers)
            await out.prepare(request)
            # Chunk by chunk as the instance produces them: streaming and
            # server-sent events reach the client without buffering.
            try:
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionResetError:
                # The client left (mid-stream, or just after a stream's last
                # event): nobody to answer, nothing of the gateway's failed.
                # The slot is released, not kept: the instance's connection
                # still carries the rest of its answer.
                CLIENT_GONE.inc()
                return out
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
        if r.path == "/v2":
            # The Open Inference Protocol's server metadata.
            return web.json_response({"name": "galaxy", "version": "1", "extensions": []})
        models = await self._model_list(token)
        if r.kind == "model":  # OpenAI's models.retrieve
            for m in models:
                if m["id"] == r.function:
                    return web.json_response(m)
            raise NotFound(f"model: no function {r.function!r}")
        return web.Response(
            text=json.dumps({"object": "list", "data": models}), content_type="application/json"
        )

    async def _model_list(self, token: str | None) -> list[dict[str, Any]]:
        """OpenAI's list of models = the deployed functions (the caller's,
        with tokens: nothing shared between callers then; without, cached
        for a second)."""
        if token is not None:
            return [_model(f) for f in await self.client.list_functions(token)]
        now = time.monotonic()
        if now - self._models[0] > 1.0:
            self._models = (now, [_model(f) for f in await self.client.list_functions()])
        return self._models[1]


def _health(r: routes.Route) -> bool:
    """Health checks answer without a token (probes hold none)."""
    return r.kind == "local" and r.path in ("/v2/health/live", "/v2/health/ready", "/healthz")


def _model(f: Any) -> dict[str, Any]:
    """One function as an OpenAI model entry."""
    return {"id": f.name, "object": "model", "created": 0, "owned_by": f.namespace or "galaxy"}
