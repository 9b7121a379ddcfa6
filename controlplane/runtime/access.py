"""Who may do what: bearer tokens, roles and namespaces (pure, no I/O).

A caller is one of:

- a **component** (a certificate of a control plane component: it may call
  everything, as before tokens existed);
- a **token** holder, with a role and, unless an admin, one namespace:

  ========== ==========================================================
  role       may
  ========== ==========================================================
  admin      everything public: functions of every namespace, traffic,
             runtimes, tokens, cluster status
  developer  deploy, delete, read, set traffic and invoke the functions
             of its namespace; apply, read and delete its graphs; read
             the runtimes
  invoker    invoke the functions and run the graphs of its namespace
             (and nothing else)
  ========== ==========================================================

- **anonymous**: no token. Only health checks and reflection answer it.

A token is ``glx_<id>_<secret>``: the id (16 hex digits) is public and
names the record; only the SHA-256 of the secret is stored, so the store
(or a backup of it) holds nothing that authenticates. The secret has 256
bits of entropy, which is why a plain hash, not a slow password hash, is
the right tool: there is nothing to brute-force (GitHub and Kubernetes
service-account tokens are checked the same way).

The gateway is a component, but it calls Dispatch *on behalf of* HTTP
clients: a call that carries a token is always judged by the token,
whoever makes it, so the gateway forwards the client's token and gets the
client's rights, never its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from controlplane.runtime.authz import PUBLIC, split_method
from controlplane.runtime.tls import COMPONENTS

ADMIN, DEVELOPER, INVOKER = "admin", "developer", "invoker"
ROLES = (ADMIN, DEVELOPER, INVOKER)
#: The namespace of a function deployed without one.
DEFAULT_NAMESPACE = "default"
TOKEN_PREFIX = "glx_"
_ID_HEX = 16
_SECRET_BYTES = 32
#: gRPC metadata key (lowercase, as gRPC requires) and HTTP header.
METADATA_KEY = "authorization"
#: Metadata a component sends for a caller without a token (the gateway,
#: for an HTTP request without Authorization): the call is then judged as
#: anonymous, not with the component's certificate.
ANONYMOUS_KEY = "galaxy-anonymous"

# Which roles may call each public method. Methods missing here but in
# authz.PUBLIC are open to any authenticated caller; health and reflection
# are open to everyone (probes and tooling hold no token).
_OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
_ROLES_OF: dict[str, frozenset[str]] = {
    # Function management: namespace checked by the servicer.
    **dict.fromkeys(
        (
            "DeployFunction",
            "GetFunction",
            "ListFunctions",
            "DeleteFunction",
            "ListRevisions",
            "SetTraffic",
            "GetRuntime",
            "ListRuntimes",
            "ApplyGraph",
            "ListGraphs",
            "DeleteGraph",
        ),
        frozenset({ADMIN, DEVELOPER}),
    ),
    # Running a graph reads it first (the gateway asks with the caller's
    # token): whoever may invoke a namespace's functions may read its
    # graphs. Namespace checked by the servicer.
    "GetGraph": frozenset(ROLES),
    # Cluster-wide views and what changes what every namespace may run.
    **dict.fromkeys(
        (
            "GetClusterStatus",
            "ListInstances",
            "PutRuntime",
            "DeleteRuntime",
            "CreateToken",
            "ListTokens",
            "DeleteToken",
            "WarmModel",
        ),
        frozenset({ADMIN}),
    ),
    # The data path: namespace checked by Dispatch (Release needs only the
    # lease id, an unguessable capability handed out by Dispatch).
    **dict.fromkeys(("Dispatch", "DispatchStream", "Release"), frozenset(ROLES)),
}
#: Methods an anonymous caller may reach; Dispatch then admits it only to a
#: public function (``check_invoke``). Membership is how a client finds the
#: Dispatch instance that owns a function: routing, not a secret.
_ANONYMOUS_OK = frozenset({"Dispatch", "DispatchStream", "Release", "GetMembership"})


class Kind(Enum):
    """What kind of caller a principal is."""

    COMPONENT = "component"
    TOKEN = "token"
    ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. namespace is "" for admins and components
    (every namespace)."""

    kind: Kind
    name: str
    role: str = ""
    namespace: str = ""
    token_id: str = ""

    def describe(self) -> str:
        """A short, secret-free description for errors and logs."""
        if self.kind is Kind.TOKEN:
            ns = f" in namespace {self.namespace}" if self.namespace else ""
            return f"token {self.token_id} ({self.role}{ns})"
        if self.kind is Kind.ANONYMOUS:
            return f"{self.name} without a token"
        return self.name

    def sees(self, namespace: str) -> bool:
        """May this principal act on the functions of namespace?"""
        if self.kind is Kind.ANONYMOUS:
            return False
        return not self.namespace or self.namespace == (namespace or DEFAULT_NAMESPACE)


ANONYMOUS_PRINCIPAL = Principal(Kind.ANONYMOUS, "anonymous")


@dataclass(frozen=True)
class TokenRecord:
    """What is stored about a token: never the secret, only its hash."""

    id: str
    name: str
    role: str
    namespace: str
    sha256: str
    created_unix: float = 0.0

    def principal(self) -> Principal:
        """The principal this token authenticates."""
        return Principal(Kind.TOKEN, self.name, self.role, self.namespace, self.id)


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: a gRPC status name and a message (no secret)."""

    code: str  # "UNAUTHENTICATED" or "PERMISSION_DENIED"
    message: str


def digest(secret: str) -> str:
    """The stored form of a token's secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(
    name: str,
    role: str,
    namespace: str,
    *,
    now_unix: float = 0.0,
    randbytes: Callable[[int], bytes] = secrets.token_bytes,
) -> tuple[str, TokenRecord]:
    """A fresh token (shown once) and the record to store for it."""
    raw = randbytes(_ID_HEX // 2 + _SECRET_BYTES)
    tid = raw[: _ID_HEX // 2].hex()
    secret = raw[_ID_HEX // 2 :].hex()
    rec = TokenRecord(tid, name, role, "" if role == ADMIN else namespace, digest(secret), now_unix)
    return f"{TOKEN_PREFIX}{tid}_{secret}", rec


def parse(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    tid, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
    if not sep or len(tid) != _ID_HEX or not secret or not _is_hex(tid):
        return None
    return tid, secret


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s)


def bearer(header: str) -> str | None:
    """The token of an ``authorization`` value ``Bearer <token>``, else None."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def matches(record: TokenRecord, secret: str) -> bool:
    """Does secret belong to record? Constant-time, so the answer's timing
    says nothing about how much of a guess was right."""
    return hmac.compare_digest(record.sha256, digest(secret))


def caller(
    identity: str | None, token_principal: Principal | None, anonymous: bool = False
) -> Principal:
    """Who is calling: the token's principal when a valid one was sent
    (whoever forwards it), else anonymous when the caller says it acts for
    someone without a token (``ANONYMOUS_KEY``), else a component by its
    certificate, else anonymous. The gateway's own certificate is a
    component's too: it calls the controller for membership; what it
    forwards for clients carries the client's token or the anonymous mark."""
    if token_principal is not None:
        return token_principal
    if anonymous:
        return ANONYMOUS_PRINCIPAL
    if identity in COMPONENTS:
        return Principal(Kind.COMPONENT, identity)
    if identity:
        return Principal(Kind.ANONYMOUS, f"certificate {identity}")
    return ANONYMOUS_PRINCIPAL


def decide(method: str, who: Principal) -> Refusal | None:
    """None when who may call method (a full gRPC method name), else why not.

    Namespaces are not judged here (the method's request names the
    function); servicers call ``check_namespace`` once they know it.
    """
    service, name = split_method(method)
    if service in _OPEN_SERVICES or who.kind is Kind.COMPONENT:
        return None
    if name not in PUBLIC.get(service, frozenset()):
        return Refusal(
            "PERMISSION_DENIED",
            f"method {method} needs a component certificate; the caller is {who.describe()}",
        )
    if who.kind is Kind.ANONYMOUS and name not in _ANONYMOUS_OK:
        return Refusal(
            "UNAUTHENTICATED",
            f"method {method} needs a bearer token (metadata 'authorization: Bearer glx_...')",
        )
    roles = _ROLES_OF.get(name)
    if roles is not None and who.kind is Kind.TOKEN and who.role not in roles:
        need = " or ".join(r for r in ROLES if r in roles)
        return Refusal(
            "PERMISSION_DENIED", f"method {method} needs role {need}; caller is {who.describe()}"
        )
    return None


def check_invoke(who: Principal, namespace: str, public: bool, what: str) -> Refusal | None:
    """None when who may invoke a function of namespace (public: anyone
    may); an anonymous caller of a function that is not public is
    UNAUTHENTICATED (a token would help), a token of another namespace
    PERMISSION_DENIED."""
    if public:
        return None
    if who.kind is Kind.ANONYMOUS:
        return Refusal(
            "UNAUTHENTICATED",
            f"{what} needs a bearer token (it is not public); send 'authorization: Bearer glx_...'",
        )
    return check_namespace(who, namespace, what)


def check_namespace(who: Principal, namespace: str, what: str) -> Refusal | None:
    """None when who may act on a function of namespace; what names it
    (e.g. "function echo") in the refusal."""
    if who.sees(namespace):
        return None
    return Refusal(
        "PERMISSION_DENIED",
        f"{what} is in namespace {namespace or DEFAULT_NAMESPACE}; {who.describe()} is not",
    )


class TokenCache:
    """Token records by id, each kept ttl_s (a miss too, so a flood of one
    unknown id costs one lookup per ttl_s); at most max_entries, oldest
    dropped first. Revocation reaches a cache within ttl_s; the component
    that revokes forgets at once (``forget``). Clock injected (seconds)."""

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # id -> (looked up at, record or None, trusted until)
        self._entries: OrderedDict[str, tuple[float, TokenRecord | None, float]] = OrderedDict()

    def get(self, token_id: str, now: float) -> tuple[bool, TokenRecord | None]:
        """(known, record): known False means "look it up"."""
        hit = self._entries.get(token_id)
        if hit is None or now >= hit[2]:
            return False, None
        return True, hit[1]

    def put(self, token_id: str, record: TokenRecord | None, now: float) -> None:
        """Remember a lookup's answer (None: no such token)."""
        self._entries[token_id] = (now, record, now + self.ttl_s)
        self._entries.move_to_end(token_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def stale(self, token_id: str, now: float, max_stale_s: float) -> TokenRecord | None:
        """A record looked up at most max_stale_s ago, expired or not: what
        a component may keep trusting while the lookup itself fails (the
        controller restarting), so an outage of the controller does not
        stop invocations; a revocation then waits for the controller."""
        hit = self._entries.get(token_id)
        if hit is None or hit[1] is None or now - hit[0] > max_stale_s:
            return None
        return hit[1]

    def hold(self, token_id: str, until: float) -> None:
        """Trust an entry until then without a new lookup (keeps when it was
        looked up, which bounds ``stale``)."""
        hit = self._entries.get(token_id)
        if hit is not None:
            self._entries[token_id] = (hit[0], hit[1], until)

    def forget(self, token_id: str) -> None:
        """Drop one entry (after a revocation here)."""
        self._entries.pop(token_id, None)

    def __len__(self) -> int:
        return len(self._entries)
