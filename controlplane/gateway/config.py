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
    retry_after_s: int = setting(1, "Retry-After of a shed or unavailable answer", ge=0, le=3600)
    https_cert: str = setting(
        "", "serve HTTPS with this certificate chain (PEM file; needs --https-key)"
    )
    https_key: str = setting("", "private key of --https-cert (PEM file)")
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
