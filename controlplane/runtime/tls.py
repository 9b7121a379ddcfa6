"""TLS material and mutual-TLS plumbing for Galaxy's gRPC traffic.

A directory holds a private CA (``ca.pem``, ``ca-key.pem``) and per identity
``{identity}.pem`` and ``{identity}-key.pem`` (e.g. ``client/admin.pem``).
An identity is the URI SAN ``spiffe://galaxy/{identity}`` (SPIFFE-shaped,
so a SPIFFE workload API could serve it later without renaming anything).
Hosts are DNS and IPAddress SANs: gRPC checks the host a channel dials
against them (an IP literal against an IPAddress SAN), so no target-name
override is ever needed.
Not on by default: rpc.py uses it only when given a TlsConfig (docs/security.md).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import ipaddress
import os
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controlplane.runtime import leasetoken
from controlplane.runtime.validation import short

SPIFFE_PREFIX = "spiffe://galaxy/"
#: Component identities (a certificate each), the operator's client (the CLI,
#: the SDK), and both together: what `galaxy certs init` issues.
COMPONENTS = ("controller", "dispatch", "schedule", "clustermgr", "nodeagent", "gateway")
ADMIN = "client/admin"
DEFAULT_IDENTITIES = (*COMPONENTS, ADMIN)
#: Hosts a certificate covers when none are given: this machine.
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")

CA_DAYS = 3650
LEAF_DAYS = 365
# `ensure` reissues a certificate this close to its end, so a control plane
# started with `galaxy up` never runs on one about to expire.
RENEW_BEFORE = timedelta(days=30)
# Backdated start: a peer whose clock is a little behind still accepts it.
_SKEW = timedelta(minutes=5)

# Slash-separated lowercase segments, a subset of [a-z0-9/-]{1,100}: no empty
# segment, so an identity can never become an absolute path or "a//b".
_IDENTITY = re.compile(r"[a-z0-9-]+(?:/[a-z0-9-]+)*")
_NO_PASSWORD = serialization.NoEncryption()
_DNS_NAME = re.compile(r"(?:\*\.)?[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def check_identity(identity: str) -> str:
    """identity, or ValueError naming it (truncated) when it is not valid."""
    if not (len(identity) <= 100 and _IDENTITY.fullmatch(identity)):
        raise ValueError(
            f"identity {short(identity)}: must be 1-100 characters of a-z, 0-9, '-' "
            "in '/'-separated segments, e.g. dispatch or client/admin"
        )
    # "ca" and "*-key" would overwrite the CA or another identity's key file.
    if identity == "ca" or identity.endswith("-key"):
        raise ValueError(f"identity {short(identity)}: reserved (its file names are taken)")
    return identity


def _san(host: str) -> x509.GeneralName:
    """The SAN of host: IPAddress for an IP literal, else DNSName."""
    with contextlib.suppress(ValueError):  # not an IP literal: a DNS name
        return x509.IPAddress(ipaddress.ip_address(host))
    if len(host) > 253 or not _DNS_NAME.fullmatch(host):
        raise ValueError(f"host {short(host)}: not an IP address or DNS name")
    return x509.DNSName(host.lower())


def cert_path(dir: Path | str, identity: str) -> Path:
    """Where the certificate of identity is kept."""
    return Path(dir) / f"{check_identity(identity)}.pem"


def key_path(dir: Path | str, identity: str) -> Path:
    """Where the private key of identity is kept."""
    return Path(dir) / f"{check_identity(identity)}-key.pem"


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically with mode: `rotate` replaces files a running process
    may read. mkstemp makes the temp file 0600, whatever the umask, so a key
    is never readable by others, not even for a moment."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _write_pair(cert: Path, key: Path, c: x509.Certificate, k: ec.EllipticCurvePrivateKey) -> None:
    pem = serialization.Encoding.PEM
    _write(key, k.private_bytes(pem, serialization.PrivateFormat.PKCS8, _NO_PASSWORD), 0o600)
    _write(cert, c.public_bytes(pem), 0o644)


def _builder(
    subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey, end: datetime
) -> x509.CertificateBuilder:
    """Subject CN, issuer (None: self-signed), public key, validity until end."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.now(UTC) - _SKEW)
        .not_valid_after(end)
    )


def _key_usage(ca: bool) -> x509.KeyUsage:
    # A CA signs certificates and CRLs; a leaf signs TLS handshakes only.
    return x509.KeyUsage(not ca, False, False, False, False, ca, ca, False, False)


def create_ca(dir: Path | str) -> x509.Certificate:
    """Write a new CA (EC P-256, 10 years) to dir/ca.pem and dir/ca-key.pem."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder("Galaxy CA", None, key, datetime.now(UTC) + timedelta(days=CA_DAYS))
        # path_length=0: the CA signs leaf certificates only.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(Path(dir) / "ca.pem", Path(dir) / "ca-key.pem", cert, key)
    return cert


def load_ca(dir: Path | str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA of dir; FileNotFoundError or ValueError when missing or broken."""
    d = Path(dir)
    cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((d / "ca-key.pem").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{d / 'ca-key.pem'}: not an EC private key")
    return cert, key


def issue(dir: Path | str, identity: str, hosts: Sequence[str]) -> x509.Certificate:
    """Write {identity}.pem and {identity}-key.pem in dir, signed by its CA.

    The certificate (EC P-256, 1 year) names identity in a URI SAN and each
    of hosts as a DNS or IPAddress SAN. Identities under ``client/`` are for
    clients only (extended key usage clientAuth); components also serve.
    """
    check_identity(identity)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(SPIFFE_PREFIX + identity)]
    sans += dict.fromkeys(_san(h) for h in hosts)  # checked before anything is written
    ca_cert, ca_key = load_ca(dir)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if not identity.startswith("client/"):
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    # Never outlive the CA: a chain is only as valid as its shortest link.
    end = min(datetime.now(UTC) + timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(identity, ca_cert.subject, key, end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_pair(cert_path(dir, identity), key_path(dir, identity), cert, key)
    return cert


def rotate(dir: Path | str, identity: str, hosts: Sequence[str] | None = None) -> x509.Certificate:
    """A new key and certificate for identity; hosts None keeps the current hosts."""
    if hosts is None:
        current = x509.load_pem_x509_certificate(cert_path(dir, identity).read_bytes())
        hosts = describe(current)["hosts"]
    return issue(dir, identity, hosts)


def ensure(
    dir: Path | str,
    identities: Iterable[str] = DEFAULT_IDENTITIES,
    hosts: Sequence[str] = DEFAULT_HOSTS,
) -> list[str]:
    """Create the CA if missing and any certificate that is not usable.

    A certificate is (re)issued when it is missing, not from this CA, within
    RENEW_BEFORE of its end, or misses one of hosts (added to the hosts it
    had; ``client/`` identities get none). Idempotent; refuses bad input
    before writing anything. Returns what was written, "ca" first.
    """
    identities = [check_identity(i) for i in identities]
    wanted = {_san(h) for h in hosts}
    d = Path(dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = []
    if not (d / "ca.pem").exists():
        if (d / "ca-key.pem").exists():
            # Never overwrite a key some certificate may still depend on.
            raise ValueError(f"{d / 'ca-key.pem'} exists without ca.pem; move it away first")
        create_ca(d)
        written.append("ca")
    ca_cert, _ = load_ca(d)
    for identity in identities:
        client = identity.startswith("client/")
        have = _usable(d, identity, ca_cert)
        if have is None or not (client or wanted <= set(have)):
            # Never drop a host: a peer may dial the certificate by it.
            issue(d, identity, [str(g.value) for g in have or []] + ([] if client else [*hosts]))
            written.append(identity)
    if not leasetoken.key_path(d).exists():
        leasetoken.ensure(d)  # Dispatch and the node agents sign and check leases with it
        written.append("lease-key")
    if not (d / leasetoken.ROUTE_KEY_FILE).exists():
        leasetoken.ensure_route(d)  # the gateway's, derived from the lease key
        written.append("route-key")
    return written


def _usable(d: Path, identity: str, ca: x509.Certificate) -> list[x509.GeneralName] | None:
    """The host SANs of identity's certificate, or None when it is missing,
    does not match its key, is not from ca, or ends within RENEW_BEFORE."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path(d, identity).read_bytes())
        key = serialization.load_pem_private_key(key_path(d, identity).read_bytes(), None)
        cert.verify_directly_issued_by(ca)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return None
    ending = cert.not_valid_after_utc - datetime.now(UTC) < RENEW_BEFORE
    if ending or key.public_key() != cert.public_key():
        return None
    return [g for g in sans(cert) if isinstance(g, x509.DNSName | x509.IPAddress)]


def sans(cert: x509.Certificate) -> list[x509.GeneralName]:
    """Every subject alternative name of cert (none: [])."""
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


def identity_of(cert: x509.Certificate) -> str | None:
    """The Galaxy identity in cert's URI SAN, or None when it has none."""
    for g in sans(cert):
        if isinstance(g, x509.UniformResourceIdentifier) and g.value.startswith(SPIFFE_PREFIX):
            rest = g.value.removeprefix(SPIFFE_PREFIX)
            if len(rest) <= 100 and _IDENTITY.fullmatch(rest):
                return rest
    return None


def describe(cert: x509.Certificate) -> dict[str, Any]:
    """identity, hosts (DNS and IP SANs, as text) and not_after of cert."""
    hosts = [str(g.value) for g in sans(cert) if isinstance(g, x509.DNSName | x509.IPAddress)]
    return {"identity": identity_of(cert), "hosts": hosts, "not_after": cert.not_valid_after_utc}


@dataclass(frozen=True)
class TlsConfig:
    """The files one process needs for mutual TLS: the CA and its own pair.

    The files are read each time credentials are made, so a process that
    makes a new server or channel after `rotate` picks up the new pair.
    """

    ca: Path
    cert: Path
    key: Path
    #: Name every server certificate carries, checked instead of the dialled
    #: host (Kubernetes: peers are dialled by pod IPs no certificate can list
    #: ahead of time). None checks the dialled host.
    server_name: str | None = None

    @classmethod
    def for_identity(
        cls, dir: Path | str, identity: str, server_name: str | None = None
    ) -> TlsConfig:
        """The config of identity's files in a `galaxy certs` directory."""
        ca = Path(dir) / "ca.pem"
        return cls(ca, cert_path(dir, identity), key_path(dir, identity), server_name)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present our pair, require a client certificate from the CA."""
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca.read_bytes(),
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only the CA, present our pair."""
        return grpc.ssl_channel_credentials(
            self.ca.read_bytes(), self.key.read_bytes(), self.cert.read_bytes()
        )


@functools.lru_cache(maxsize=256)
def _identity_of_pem(pem: bytes) -> str | None:
    # Cached: the interceptor asks on every RPC, and peers are few.
    try:
        return identity_of(x509.load_pem_x509_certificate(pem))
    except ValueError:
        return None


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The Galaxy identity of the peer of an RPC, or None.

    Only meaningful on a server made with ``require_client_auth=True``
    (``TlsConfig.server_credentials``): gRPC has then already verified the
    peer's chain up to our CA and its validity dates during the handshake,
    so the certificate in the auth context can be trusted as is. Without TLS
    (or without a client certificate) there is none, and this is None.
    """
    pems = context.auth_context().get("x509_pem_cert")
    return _identity_of_pem(bytes(pems[0])) if pems else None


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """Runs ``check(method, context)`` before every method, in the method's
    own task (where the peer's certificate is known, and where a context
    variable it sets reaches the method); check aborts to refuse.
    rpc.create_server puts guards before Galaxy's own interceptor."""

    async def check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Refuse (context.abort) or return; see the subclasses."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method

        async def check(context: grpc.aio.ServicerContext) -> None:
            await self.check(method, context)

        return guard_handler(handler, check)


class IdentityInterceptor(GuardInterceptor):
    """Refuses an RPC with PERMISSION_DENIED unless allowed(method, identity).

    method is the full name ("/galaxy.v1.Dispatch/Dispatch"), identity what
    `peer_identity` reports (None: no Galaxy certificate).
    """

    def __init__(self, allowed: Callable[[str, str | None], bool]) -> None:
        self._allowed = allowed

    async def check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """PERMISSION_DENIED unless the peer's identity may call method."""
        who = peer_identity(context)
        if not self._allowed(method, who):
            # method is one of ours (it has a handler) and who matched a
            # 100-character pattern: the message stays short.
            presented = f"identity {who}" if who else "no identity"
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"method {method} needs a component certificate; the peer presented {presented}",
            )


def guard_handler(
    handler: grpc.RpcMethodHandler,
    check: Callable[[grpc.aio.ServicerContext], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """handler, running check(context) first in the same task as the method
    (so what check sets in a context variable, the method sees)."""
    for kind, make in _HANDLER_KINDS:
        if (inner := getattr(handler, kind)) is not None:
            return make(  # type: ignore[no-any-return,operator]
                _guarded(inner, check),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


_HANDLER_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def _guarded(
    inner: Callable[..., Any], check: Callable[[grpc.aio.ServicerContext], Awaitable[None]]
) -> Callable[..., Any]:
    """inner(request_or_iterator, context), after check(context)."""
    if inspect.isasyncgenfunction(inner):

        async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            async for item in inner(request, context):
                yield item

        return gen

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(context)
        return await inner(request, context)

    return call
