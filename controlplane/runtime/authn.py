"""Bearer-token authentication on a gRPC server (the I/O around
``controlplane.runtime.access``).

``AccessInterceptor`` replaces the certificate-only check on the servers
with a public API (controller, Dispatch): it reads the caller's certificate
identity and ``authorization`` metadata, resolves the token (a cache in
front of a lookup: the state store in the controller, the controller in
Dispatch), refuses with UNAUTHENTICATED or PERMISSION_DENIED, and leaves
the principal where the servicer finds it (``current``) for the namespace
checks that need the request. Refusals are logged and counted with the
token's public id only, never the secret.

A call is authenticated when it opens; a stream (Dispatch's
DispatchStream, which the SDK and the gateway keep open) carries many
requests, so each one calls ``recheck`` first: the token is looked up again
once its cache entry expires, and a revoked token is refused from then on,
within the cache's TTL of the revocation (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
from prometheus_client import Counter

from controlplane.runtime import access
from controlplane.runtime.access import Kind, Principal, Refusal, TokenRecord
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.errors import PermissionDenied, Unauthenticated
from controlplane.runtime.tls import GuardInterceptor, peer_identity

log = logging.getLogger(__name__)

REFUSED = Counter(
    "galaxy_auth_refused_total", "Calls refused by authentication or authorization", ["code"]
)

#: Without an AccessInterceptor (tokens off) every caller may act on every
#: namespace, as before tokens existed.
_UNCHECKED = Principal(Kind.COMPONENT, "unchecked")
_current: ContextVar[Principal] = ContextVar("galaxy_principal", default=_UNCHECKED)
#: The token the current call was opened with (None: no token, or tokens off).
_guard: ContextVar[TokenGuard | None] = ContextVar("galaxy_token_guard", default=None)

Lookup = Callable[[str], Awaitable[TokenRecord | None]]
#: While lookups fail, a token served from its last record is looked up
#: again at most this often.
STALE_RETRY_S = 1.0


def current() -> Principal:
    """The principal of the RPC being served (set by AccessInterceptor)."""
    return _current.get()


def ensure_invoke(namespace: str, public: bool, what: str) -> None:
    """Raise UNAUTHENTICATED or PERMISSION_DENIED unless the current caller
    may invoke that function (``access.check_invoke``)."""
    refusal = access.check_invoke(current(), namespace, public, what)
    if refusal is not None:
        REFUSED.labels(refusal.code).inc()
        if refusal.code == "UNAUTHENTICATED":
            raise Unauthenticated(refusal.message)
        raise PermissionDenied(refusal.message)


def ensure_namespace(namespace: str, what: str) -> None:
    """Raise PERMISSION_DENIED unless the current caller may act on a
    function of namespace (what names it in the message)."""
    refusal = access.check_namespace(current(), namespace, what)
    if refusal is not None:
        REFUSED.labels(refusal.code).inc()
        raise PermissionDenied(refusal.message)


#: Pass as a token to call on behalf of a caller without one (the gateway).
ANONYMOUS = "anonymous"


async def recheck() -> None:
    """Raise Unauthenticated if the current call's token was revoked since
    the call opened (for each request a stream carries; a no-op for a call
    without a token). Costs a cache read while the token's entry is fresh."""
    guard = _guard.get()
    if guard is None:
        return
    refusal = await guard.check()
    if refusal is not None:
        REFUSED.labels(refusal.code).inc()
        raise Unauthenticated(refusal.message)


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """gRPC call metadata carrying token (None: no metadata; ``ANONYMOUS``:
    the mark of a caller without a token)."""
    if token == ANONYMOUS:
        return ((access.ANONYMOUS_KEY, "1"),)
    return ((access.METADATA_KEY, f"Bearer {token}"),) if token else None


def forwarded_metadata(context: Any) -> tuple[tuple[str, str], ...] | None:
    """What to send when forwarding the current call to another instance,
    which judges it again: the caller's token, or the anonymous mark for a
    caller without one (whether it came marked or just without a token), so
    a forwarded call never gets the forwarder's own rights. Nothing for a
    component's own call."""
    who = current()
    if who.kind is Kind.ANONYMOUS:
        return ((access.ANONYMOUS_KEY, "1"),)
    if who.kind is Kind.TOKEN:
        md = tuple(
            (k, v) for k, v in context.invocation_metadata() or () if k == access.METADATA_KEY
        )
        return md or None
    return None


class Authenticator:
    """Turns an ``authorization`` value into a principal, with a cache in
    front of lookup (one lookup at a time per token id)."""

    def __init__(
        self,
        lookup: Lookup,
        cache: access.TokenCache | None = None,
        clock: Clock | None = None,
        max_stale_s: float = 300.0,
    ) -> None:
        self.lookup = lookup
        self.cache = cache or access.TokenCache()
        self.clock = clock or MonotonicClock()
        #: how long a known token is still trusted while lookups fail
        self.max_stale_s = max_stale_s
        self._inflight: dict[str, asyncio.Future[TokenRecord | None]] = {}

    async def principal(self, header: str | None) -> Principal | Refusal | None:
        """The token's principal, a refusal for a bad token, or None when no
        token was sent."""
        if header is None:
            return None
        token = access.bearer(header)
        parsed = access.parse(token) if token else None
        if parsed is None:
            return Refusal("UNAUTHENTICATED", "authorization: not a Galaxy bearer token")
        tid, secret = parsed
        record = await self._record(tid)
        if record is None or not access.matches(record, secret):
            return Refusal("UNAUTHENTICATED", f"authorization: token {tid} is unknown or revoked")
        return record.principal()

    async def _record(self, tid: str) -> TokenRecord | None:
        known, record = self.cache.get(tid, self.clock.now())
        if known:
            return record
        pending = self._inflight.get(tid)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[TokenRecord | None] = asyncio.get_running_loop().create_future()
        self._inflight[tid] = fut
        try:
            record = await self.lookup(tid)
        except Exception as e:
            now = self.clock.now()
            stale = self.cache.stale(tid, now, self.max_stale_s)
            if stale is not None:
                # The controller is down or restarting: keep the data path up,
                # asking again at most once a second meanwhile.
                log.warning("token %s: lookup failed (%s); trusting its last record", tid, e)
                self.cache.hold(tid, now + STALE_RETRY_S)
                fut.set_result(stale)
                return stale
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters re-raise it, no "never retrieved" warning
            raise
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            self._inflight.pop(tid, None)
        self.cache.put(tid, record, self.clock.now())
        fut.set_result(record)
        return record


class TokenGuard:
    """The token a call was opened with, checked again on demand (``check``)
    through its authenticator's cache."""

    def __init__(self, authenticator: Authenticator, token_id: str, secret: str) -> None:
        self.authenticator = authenticator
        self.token_id = token_id
        self.secret = secret
        self._verified: TokenRecord | None = None  # the record last matched

    async def check(self) -> Refusal | None:
        """A refusal if the token is now unknown or revoked, else None."""
        auth = self.authenticator
        known, record = auth.cache.get(self.token_id, auth.clock.now())
        if known and record is not None and record is self._verified:
            return None  # the entry that was matched, still fresh: no hash
        record = await auth._record(self.token_id)
        if record is None or not access.matches(record, self.secret):
            return Refusal(
                "UNAUTHENTICATED", f"authorization: token {self.token_id} is unknown or revoked"
            )
        self._verified = record
        return None


class AccessInterceptor(GuardInterceptor):
    """Authenticates every call and refuses what the caller's role may not
    call (``access.decide``); see the module docstring."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Sets the caller's principal, or refuses the call."""
        header, anonymous = None, False
        for key, value in context.invocation_metadata() or ():
            if key == access.METADATA_KEY:
                header = value
            elif key == access.ANONYMOUS_KEY:
                anonymous = True
        try:
            got = await self.authenticator.principal(header)
        except Exception as e:  # the lookup failed: the caller may retry
            log.warning("cannot verify a token for %s: %s", method, e)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "authorization: cannot verify the token now; retry"
            )
            return
        if isinstance(got, Refusal):
            refusal: Refusal | None = got
        else:
            who = access.caller(peer_identity(context), got, anonymous)
            refusal = access.decide(method, who)
            if refusal is None:
                _current.set(who)
                if got is not None and header is not None:
                    parsed = access.parse(access.bearer(header) or "")
                    if parsed is not None:
                        _guard.set(TokenGuard(self.authenticator, *parsed))
                return
        assert refusal is not None
        REFUSED.labels(refusal.code).inc()
        log.warning("refused %s: %s", method, refusal.message)
        await context.abort(grpc.StatusCode[refusal.code], refusal.message)


def record_of(reply: Any) -> TokenRecord | None:
    """Controller.LookupToken's answer as a record (None: no such token)."""
    if not reply.found:
        return None
    i = reply.info
    return TokenRecord(i.id, i.name, i.role, i.namespace, reply.sha256, i.created_unix)
