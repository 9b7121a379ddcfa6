"""gRPC helpers: every server and channel of Galaxy is made here.

One place to switch on credentials (mutual TLS: ``RpcConfig.tls``), to add the standard
health and reflection services, to map errors to clear statuses, and to make
sure every outgoing RPC carries a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controlplane.runtime import reflection
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.metrics import RPC_LATENCY, RPC_REQUESTS
from controlplane.runtime.tls import TlsConfig
from controlplane.runtime.validation import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

# Deadline applied to an outgoing RPC whose caller did not choose one.
DEFAULT_TIMEOUT_S: float = RpcConfig.model_fields["deadline_s"].default

# Message size limits, set explicitly in both directions on every server and
# channel (gRPC's defaults differ by side: 4 MiB in, unlimited out), so a
# peer can neither send nor be sent more than MAX_MESSAGE_BYTES; the
# controller bounds its largest answer below it (docs/security.md).
_SIZE_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
#: The least time a new connection gets to finish its handshake, ms
#: (gRPC's default).
CONNECT_TIMEOUT_MS = 20_000
# Keepalive so a dead peer is noticed.
_CHANNEL_OPTIONS = [
    *_SIZE_OPTIONS,
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.enable_http_proxy", 0),
    # Peers start in any order; gRPC's default reconnect backoff (1 s, growing
    # to 120 s) would leave a component waiting long after its peer is up.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # Not a backoff: gRPC reads this as the least time a connection attempt
    # gets to complete (TCP, then the peer's HTTP/2 SETTINGS). It was 100 ms:
    # a peer a moment late with its SETTINGS (a loaded machine, a process
    # busy for 0.1 s) failed the call at once with UNAVAILABLE "connection
    # attempt timed out before receiving SETTINGS frame" or "Handshake read
    # failed" (a test stops a server for 0.5 s: tests/unit/test_rpc_connect.py).
    # The call's own deadline still bounds the wait.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
]
_SERVER_OPTIONS = [
    *_SIZE_OPTIONS,
    ("grpc.so_reuseport", 0),
]


def _sized(options: list[tuple[str, Any]], max_message_bytes: int) -> list[tuple[str, Any]]:
    """options with the message size limits set to max_message_bytes."""
    if max_message_bytes == MAX_MESSAGE_BYTES:
        return options
    sizes = {k for k, _ in _SIZE_OPTIONS}
    return [(k, max_message_bytes if k in sizes else v) for k, v in options]


class _ErrorAndMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every unary RPC and turns exceptions into statuses.

    A GalaxyError becomes its status and message. Any other exception is
    logged with its traceback here and answered as INTERNAL with a short
    message, so a client never sees a Python traceback. A request that does
    not decode as its message type is INVALID_ARGUMENT: gRPC would run the
    deserializer before any handler and answer UNKNOWN with a logged
    traceback, so the deserializer is wrapped to hand the handler a marker.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is not None and handler.stream_stream is not None:
            # A stream's messages are decoded one by one while it is open:
            # the handler gets an Undecodable in place of a bad one and ends
            # the stream with INVALID_ARGUMENT (it counts its own messages).
            return grpc.stream_stream_rpc_method_handler(
                handler.stream_stream,
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler is None or handler.unary_unary is None:
            return handler
        # "/galaxy.v1.Dispatch/Dispatch" -> "Dispatch/Dispatch": short labels.
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        name = f"{service.rsplit('.', 1)[-1]}/{method}"
        inner = handler.unary_unary
        latency = RPC_LATENCY.labels(name)

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if isinstance(request, Undecodable):
                    code = grpc.StatusCode.INVALID_ARGUMENT
                    await context.abort(code, f"request: {request.reason}")
                return await inner(request, context)
            except GalaxyError as e:
                code = e.code
                await context.abort(e.code, e.message)
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN  # type: ignore[assignment]
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", name)
                await context.abort(
                    grpc.StatusCode.INTERNAL,
                    f"internal error in {name}; see the server log",
                )
            finally:
                latency.observe(time.perf_counter() - start)
                RPC_REQUESTS.labels(name, code.name).inc()

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )


class Undecodable:
    """Stands in for a request whose bytes did not decode (``reason`` says
    how many bytes, never what they were)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """deserialize, answering Undecodable instead of raising on bad bytes."""
    if deserialize is None:
        return None

    def run(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as e:  # DecodeError, or anything a parser raises on garbage
            return Undecodable(
                f"{len(data)} bytes do not decode as the method's request message "
                f"({type(e).__name__})"
            )

    return run


def create_server(
    listen: str,
    services: Iterable[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]],
    config: RpcConfig | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build a grpc.aio server on listen (host:port, port 0 = any free port).

    services: (add_XServicer_to_server, servicer, full service name) triples.
    Adds the standard health service (every service SERVING once started is
    the caller's job via the returned HealthServicer) and server reflection
    (v1 and v1alpha: ``controlplane.runtime.reflection``).
    config: the message size limit and credentials (the default
    ``RpcConfig``'s when None): with ``config.tls`` the server serves mutual
    TLS only (clients must present a certificate of its CA); without, it
    serves plaintext. interceptors run before Galaxy's own, so an
    authorization check (tls.IdentityInterceptor) comes before anything else.
    Returns (server, bound port, health servicer); call ``await server.start()``.
    """
    config = config or RpcConfig()
    tls = config.tls
    server = grpc.aio.server(
        interceptors=[*interceptors, _ErrorAndMetricsInterceptor()],
        options=_sized(_SERVER_OPTIONS, config.max_message_bytes),
    )
    names = [health.SERVICE_NAME]
    for add, servicer, name in services:
        add(servicer, server)
        names.append(name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable(names, server)
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.server_credentials())
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return server, port, health_servicer


def health_only_server(listen: str, health_servicer: Any) -> tuple[grpc.aio.Server, int]:
    """A plaintext server with nothing but grpc.health.v1, sharing
    health_servicer: for probes that cannot present a certificate (a
    kubelet's gRPC probe) when the main port requires mutual TLS. It reveals
    only whether the process serves. Returns (server, bound port)."""
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return server, port


async def set_serving(health_servicer: Any, names: Iterable[str], serving: bool = True) -> None:
    """Mark the overall server ("") and each service SERVING or NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for n in ["", *names]:
        await health_servicer.set(n, status)


def insecure_channel(address: str, config: RpcConfig | TlsConfig | None = None) -> grpc.aio.Channel:
    """A new channel to address (host:port) as config describes (size
    limits, credentials; the default ``RpcConfig`` when None, and a
    ``TlsConfig`` alone is short for ``RpcConfig(tls=...)``: a one-off
    channel of a check or a test). Prefer ChannelPool.

    With ``config.tls`` the channel is mutual TLS: it trusts only tls.ca,
    presents tls.cert, and gRPC checks that the server's certificate covers
    the host of address (an IP literal against an IPAddress SAN), or
    tls.server_name. Without it the channel is plaintext (hence the name).
    """
    if not isinstance(config, RpcConfig):
        config = RpcConfig(tls=config)
    tls = config.tls
    sized = _sized(_CHANNEL_OPTIONS, config.max_message_bytes)
    if tls is None:
        return grpc.aio.insecure_channel(address, options=sized)
    options: list[tuple[str, Any]] = list(sized)
    if tls.server_name:
        # The chain to our CA and the peer's identity still count; only
        # the name checked is fixed (see TlsConfig.server_name).
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options)


S = TypeVar("S")


class Deadlined(Generic[S]):
    """A stub proxy that gives every call a deadline unless one is passed.

    ``stub.Method(req)`` becomes ``stub.Method(req, timeout=default)``.
    """

    __slots__ = ("_stub", "_timeout")

    def __init__(self, stub: S, timeout: float) -> None:
        self._stub = stub
        self._timeout = timeout

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        timeout = self._timeout

        def call(request: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout)
            return method(request, **kwargs)

        return call


class ChannelPool:
    """Connection cache: one gRPC channel per downstream address, reused.

    Call sites use ``async with pool.stub(address, XStub) as stub:``. With
    ``enabled=False`` (the ablation switch) each use opens a fresh channel and
    closes it on exit, which is the cost the cache removes. Everything comes
    from one ``RpcConfig`` (the default one when None): the cache switch,
    the deadline, size limits and credentials (with ``config.tls`` every
    channel is mutual TLS; see insecure_channel).
    """

    def __init__(self, config: RpcConfig | None = None) -> None:
        self.config = config = config or RpcConfig()
        self.enabled = config.connection_cache
        self.timeout = config.deadline_s
        self.tls = config.tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, Any], Any] = {}
        self.channels_created = 0

    @classmethod
    def of(cls, config: RpcConfig) -> ChannelPool:
        """The pool an ``RpcConfig`` describes (cache, deadline, size limit,
        credentials)."""
        return cls(config)

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = insecure_channel(address, self.config)
            self._channels[address] = ch
            self.channels_created += 1
        return ch

    @contextlib.asynccontextmanager
    async def stub(
        self, address: str, stub_cls: Callable[[grpc.aio.Channel], S]
    ) -> AsyncIterator[Any]:
        """A deadline-carrying stub of stub_cls for address, for one use."""
        if self.enabled:
            key = (address, stub_cls)
            s = self._stubs.get(key)
            if s is None:
                s = Deadlined(stub_cls(self._channel(address)), self.timeout)
                self._stubs[key] = s
            yield s
            return
        self.channels_created += 1
        ch = insecure_channel(address, self.config)
        try:
            yield Deadlined(stub_cls(ch), self.timeout)
        finally:
            await ch.close()

    async def forget(self, address: str) -> None:
        """Drop and close the channel to address (peer gone)."""
        ch = self._channels.pop(address, None)
        for key in [k for k in self._stubs if k[0] == address]:
            del self._stubs[key]
        if ch is not None:
            await ch.close()

    async def close(self) -> None:
        """Close every pooled channel."""
        chans = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for ch in chans:
            await ch.close()


async def serving(pool: ChannelPool, address: str, timeout_s: float = 1.0) -> bool:
    """True when the server at address answers grpc.health.v1 SERVING
    within timeout_s (the controller's check of a silent or reported member)."""
    try:
        async with pool.stub(address, health_pb2_grpc.HealthStub) as s:
            r = await s.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return bool(r.status == health_pb2.HealthCheckResponse.SERVING)
