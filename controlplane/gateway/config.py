"""The gateway's configuration (flags of `galaxy serve gateway`)."""

from __future__ import annotations

from controlplane.runtime.config import Config, setting


class GatewayConfig(Config):
    """Routing, timeouts and load shedding of one gateway instance."""

    domain: str = setting(
        "galaxy.local",
        "Host-header routing: {function}.{domain} goes to that function ('' turns it off)",
        max_length=253,
    )
    request_timeout_s: float = setting(
        300.0,
        "the most a request may take, a scale from zero included (the request is held meanwhile)",
        gt=0,
        le=3600,
    )
    max_in_flight: int = setting(
        10_000,
        "requests proxied at once; more are shed with 503 and Retry-After",
        ge=1,
        le=1_000_000,
    )
    max_body_bytes: int = setting(
        64 * 1024 * 1024, "largest request body accepted (413 above)", ge=1024
    )
    max_connections: int = setting(
        20_000,
        "connections open at once; more get a 503 and are closed (raise `ulimit -n` to match)",
        ge=1,
        le=1_000_000,
    )
    max_upload_bytes: int = setting(
        256 * 1024 * 1024,
        "request body bytes held at once, all requests together (twice for a body parsed "
        "as JSON or of unknown length, which counts as --max-body-bytes); beyond it a 503",
        ge=1024,
    )
    header_timeout_s: float = setting(
        10.0, "a request's head (line and headers) must arrive within this", gt=0, le=3600
    )
    body_timeout_s: float = setting(
        60.0, "a request's body must arrive within this once its head did (408)", gt=0, le=3600
    )
    idle_timeout_s: float = setting(
        30.0, "an idle keep-alive connection is closed after this", gt=0, le=3600
    )
    route_entries: bool = setting(
        True,
        "with the cluster's route key (route.key) in the TLS directory, ask nodes to route new "
        "connections to instances through the kernel (no relay at the node; off: "
        "--no-route-entries; docs/security.md, The node's entry)",
    )
    max_header_bytes: int = setting(
        8190, "longest request line and header field (431/400 above)", ge=1024, le=1_048_576
    )
    cors_origins: str = setting(
        "",
        "browser origins allowed to call the gateway (comma-separated, '*' for any; "
        "default none: CORS preflights get 403)",
        max_length=4096,
    )
    retry_after_s: int = setting(1, "Retry-After of a shed or unavailable answer", ge=0, le=3600)
    https_cert: str = setting(
        "", "serve HTTPS with this certificate chain (PEM file; needs --https-key)"
    )
    https_key: str = setting("", "private key of --https-cert (PEM file)")
    access_log: bool = setting(
        True,
        "one log line per request (logger galaxy.access: method, path, status, duration, "
        "function, revision, request id); off: --no-access-log",
    )
    slot_cache: bool = setting(
        True,
        "keep a lease after its request and reuse it for the next request of the same "
        "function, tag and token, skipping the Dispatch call (off: one Dispatch per request)",
    )
    slot_idle_ms: float = setting(
        20.0, "release a held lease idle this long (milliseconds)", gt=0, le=60_000
    )
    slot_max_per_function: int = setting(
        64, "leases held idle at most per function", ge=1, le=100_000
    )
    slot_max: int = setting(1024, "leases held idle at most in all", ge=1, le=1_000_000)
    graphs_dir: str = setting(
        "",
        "also serve the inference graphs of this directory's *.yaml files at POST "
        "/graphs/NAME; a graph stored by the controller wins a name clash (docs/models.md, graphs)",
        max_length=4096,
    )
    batch_parallel: int = setting(
        2,
        "adaptive batching: batches in flight per function before requests wait to form "
        "a larger one (docs/models.md)",
        ge=1,
        le=10_000,
    )
    batch_max_queue: int = setting(
        1024,
        "adaptive batching: requests waiting per function at most (429 beyond)",
        ge=1,
        le=1_000_000,
    )
