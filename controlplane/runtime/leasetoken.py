"""Lease tokens: the proof a caller shows at a node's entry that Dispatch
granted it a slot on one instance (pure: no I/O but the key file helpers, the
clock is passed in).

A token is ``<expiry_ms>.<mac>``: the wall-clock end of the lease in
milliseconds and a truncated HMAC-SHA256, under the cluster's lease key, of
the instance id and that end. Dispatch signs one for every lease it grants
(``InstanceAddr.lease_token``); the caller sends it in the ``Galaxy-Lease``
header; the entry in front of the instance checks it names that instance and
has not ended. The key is shared by Dispatch and the node agents only (a file
next to their TLS material, ``lease.key``); an instance never sees it.

Route tokens (``RouteKey``) are the gateway's: under a key derived from the
lease key (``route.key``, which the gateway holds and which signs no
lease), they let one connection from one source port past a node's door
straight to the instance (``nodeagent/entry/routing.py``).
"""

from __future__ import annotations

import argparse
import base64
import enum
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

#: The request header that carries a lease token.
HEADER = "Galaxy-Lease"
#: File name of the cluster's lease key, in the TLS directory.
KEY_FILE = "lease.key"
KEY_BYTES = 32
#: Wall clocks of Dispatch and a node differ: a token is accepted this long
#: after its end (a lease's own life is the function's request timeout,
#: seconds to minutes, so this adds little to what a leaked token allows).
SKEW_MS = 2_000
_MAC_BYTES = 16  # 128 bits: forging needs 2^128 tries
_DOMAIN = b"galaxy-lease-v1\0"
_ROUTE_DOMAIN = b"galaxy-route-v1\0"
_ROUTE_KEY_DOMAIN = b"galaxy-route-key-v1\0"
#: File name of the cluster's route key (derived from the lease key), in
#: the TLS directory: the gateway's, to make route tokens.
ROUTE_KEY_FILE = "route.key"
#: The request header of an entry route request (``sign_route``).
ROUTE_HEADER = "Galaxy-Route"
#: How long a route token is good for: the caller connects right after.
ROUTE_TTL_MS = 5_000


class Verdict(enum.Enum):
    """The entry's answer to a token: OK, or why it is refused."""

    OK = "ok"
    MISSING = "no Galaxy-Lease header: ask Dispatch for a lease"
    MALFORMED = "Galaxy-Lease is not a lease token"
    EXPIRED = "the lease has ended: ask Dispatch for a new one"
    FORGED = "Galaxy-Lease was not granted for this instance"

    @property
    def status(self) -> int:
        """HTTP status: 401 without a usable credential, 403 for a valid
        form that does not open this instance."""
        return {Verdict.OK: 200, Verdict.FORGED: 403}.get(self, 401)


class LeaseKey:
    """Signs and checks lease tokens with one cluster key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"{KEY_FILE}: a lease key has at least 16 bytes, got {len(key)}")
        self._key = key

    def _mac(self, instance_id: str, expiry_ms: int) -> bytes:
        msg = b"%s%s\0%d" % (_DOMAIN, instance_id.encode(), expiry_ms)
        return hmac.digest(self._key, msg, hashlib.sha256)[:_MAC_BYTES]

    def sign(self, instance_id: str, expiry_ms: int) -> str:
        """The token for a lease on instance_id ending at expiry_ms (wall clock)."""
        mac = base64.urlsafe_b64encode(self._mac(instance_id, expiry_ms)).rstrip(b"=")
        return f"{expiry_ms}.{mac.decode()}"

    def verify(self, token: str | bytes | None, instance_id: str, now_ms: int) -> Verdict:
        """Whether token opens instance_id at now_ms (wall clock)."""
        return _check(token, lambda expiry: self._mac(instance_id, expiry), now_ms)

    def route_key(self) -> RouteKey:
        """The route key derived from this one: what the gateway holds to
        make route tokens (``route.key``), which cannot sign a lease."""
        return RouteKey(hmac.digest(self._key, _ROUTE_KEY_DOMAIN, hashlib.sha256))


def _check(token: str | bytes | None, mac_of: Callable[[int], bytes], now_ms: int) -> Verdict:
    if not token:
        return Verdict.MISSING
    if isinstance(token, bytes):
        token = token.decode("ascii", "replace")
    expiry, dot, mac = token.partition(".")
    if not dot or not expiry.isdigit() or len(expiry) > 16 or len(mac) != 22:
        return Verdict.MALFORMED
    try:
        given = base64.urlsafe_b64decode(mac + "==")
    except ValueError:
        return Verdict.MALFORMED
    if not hmac.compare_digest(given, mac_of(int(expiry))):
        return Verdict.FORGED
    if int(expiry) + SKEW_MS < now_ms:
        return Verdict.EXPIRED
    return Verdict.OK


class RouteKey:
    """Makes and checks route tokens: a route token lets the connection its
    holder opens from one source port to one instance entry's port go
    straight to the instance through the node's kernel
    (``nodeagent/entry/routing.py``). Derived from the lease key
    (``LeaseKey.route_key``): the agents check with it, the gateway makes
    them, and it signs no lease."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"{ROUTE_KEY_FILE}: a route key has at least 16 bytes, got {len(key)}")
        self._key = key

    def _route_mac(self, port: int, source_port: int, expiry_ms: int) -> bytes:
        msg = b"%s%d\0%d\0%d" % (_ROUTE_DOMAIN, port, source_port, expiry_ms)
        return hmac.digest(self._key, msg, hashlib.sha256)[:_MAC_BYTES]

    def sign_route(self, port: int, source_port: int, expiry_ms: int) -> str:
        """A route token: lets the connection the caller will open from
        source_port to the entry at port go to the instance straight
        through the kernel (``nodeagent/entry/routing.py``). Only holders of
        the route key (the gateway and the agents) can make one."""
        mac = base64.urlsafe_b64encode(self._route_mac(port, source_port, expiry_ms)).rstrip(b"=")
        return f"{expiry_ms}.{mac.decode()}"

    def verify_route(
        self, token: str | bytes | None, port: int, source_port: int, now_ms: int
    ) -> Verdict:
        """Whether token routes the connection from source_port to port."""
        return _check(token, lambda expiry: self._route_mac(port, source_port, expiry), now_ms)


def key_path(tls_dir: str | os.PathLike[str]) -> Path:
    """Where the lease key of a TLS directory is."""
    return Path(tls_dir) / KEY_FILE


def ensure(tls_dir: str | os.PathLike[str]) -> Path:
    """Make the lease key of tls_dir if it has none (mode 0600); its path."""
    path = key_path(tls_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(KEY_BYTES))
    return path


def ensure_route(tls_dir: str | os.PathLike[str]) -> Path:
    """Write the route key of tls_dir's lease key if it has none (mode
    0600): the file the gateway reads. Its path."""
    path = Path(tls_dir) / ROUTE_KEY_FILE
    lease = load(tls_dir)
    if lease is None or path.exists():
        return path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(lease.route_key()._key)
    return path


def load_route(tls_dir: str | os.PathLike[str] | None) -> RouteKey | None:
    """The route key of tls_dir (None without one: the gateway's connections
    then all go through the doors' relays)."""
    if not tls_dir:
        return None
    try:
        return RouteKey((Path(tls_dir) / ROUTE_KEY_FILE).read_bytes())
    except FileNotFoundError:
        return None


def from_args(args: argparse.Namespace) -> LeaseKey | None:
    """The lease key of a `galaxy serve` process (its resolved ``args.rpc``)."""
    rpc = getattr(args, "rpc", None)
    return load(rpc.tls_dir) if rpc is not None and rpc.tls is not None else None


def load(tls_dir: str | os.PathLike[str] | None) -> LeaseKey | None:
    """The lease key of tls_dir (None without a TLS directory or key file:
    leases then carry no token and entries check none)."""
    if not tls_dir:
        return None
    path = key_path(tls_dir)
    try:
        return LeaseKey(path.read_bytes())
    except FileNotFoundError:
        return None
