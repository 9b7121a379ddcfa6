"""Mutual TLS (runtime/tls.py, `galaxy certs`): certificates, and real gRPC
calls over real sockets between servers and channels made by runtime/rpc.py."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.runtime import rpc, tls
from controlplane.runtime.config import RpcConfig

REPO = Path(__file__).resolve().parents[2]
CHECK = "/grpc.health.v1.Health/Check"
WHOAMI = "/test.WhoAmI/Get"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `galaxy certs init` directory, plus `dnsonly` (no IP SAN)."""
    d = tmp_path_factory.mktemp("certs")
    tls.ensure(d, tls.DEFAULT_IDENTITIES, ["localhost", "127.0.0.1"])
    tls.issue(d, "dnsonly", ["localhost"])
    return d


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, unrelated CA with its own `dispatch` certificate."""
    d = tmp_path_factory.mktemp("other")
    tls.ensure(d, ["dispatch"], ["localhost", "127.0.0.1"])
    return d


def _cert(d: Path, identity: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(tls.cert_path(d, identity).read_bytes())


# -- gRPC over real sockets ---------------------------------------------------


@contextlib.asynccontextmanager
async def serve(
    cfg: tls.TlsConfig | None, allowed: Callable[[str, str | None], bool] | None = None
) -> AsyncIterator[tuple[int, list[str | None]]]:
    """rpc.create_server with health and /test.WhoAmI/Get (answers the
    caller's peer_identity); yields (port, identities WhoAmI saw)."""
    seen: list[str | None] = []

    async def whoami(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append(tls.peer_identity(context))
        return (seen[-1] or "").encode()

    handler = grpc.method_handlers_generic_handler(
        "test.WhoAmI", {"Get": grpc.unary_unary_rpc_method_handler(whoami)}
    )
    services = [
        (lambda _s, server: server.add_generic_rpc_handlers((handler,)), None, "test.WhoAmI")
    ]
    interceptors = [tls.IdentityInterceptor(allowed)] if allowed else []
    server, port, health = rpc.create_server(
        "127.0.0.1:0", services, config=RpcConfig(tls=cfg), interceptors=interceptors
    )
    await server.start()
    await rpc.set_serving(health, ["test.WhoAmI"])
    try:
        yield port, seen
    finally:
        await server.stop(None)


async def call(channel: grpc.aio.Channel, method: str = CHECK) -> object:
    """The answer of method, or the status code it failed with."""
    try:
        if method == CHECK:
            stub = health_pb2_grpc.HealthStub(channel)
            return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)).status
        return await channel.unary_unary(method)(b"", timeout=10)
    except grpc.aio.AioRpcError as e:
        return e.code()
    finally:
        await channel.close()


async def test_mtls_call_succeeds_and_server_sees_the_identity(certs: Path) -> None:
    async with serve(tls.TlsConfig.for_identity(certs, "dispatch")) as (port, seen):
        client = tls.TlsConfig.for_identity(certs, "schedule")
        ch = rpc.insecure_channel(f"127.0.0.1:{port}", client)
        assert await call(ch) == health_pb2.HealthCheckResponse.SERVING
        ch = rpc.insecure_channel(f"127.0.0.1:{port}", client)
        assert await call(ch, WHOAMI) == b"schedule"
        admin = tls.TlsConfig.for_identity(certs, tls.ADMIN)
        assert await call(rpc.insecure_channel(f"localhost:{port}", admin), WHOAMI) == (
            b"client/admin"
        )
        assert seen == ["schedule", "client/admin"]
        # The pool makes the same secure channels.
        pool = rpc.ChannelPool(RpcConfig(tls=client))
        async with pool.stub(f"127.0.0.1:{port}", health_pb2_grpc.HealthStub) as stub:
            reply = await stub.Check(health_pb2.HealthCheckRequest())
        await pool.close()
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_plaintext_is_unchanged_without_tls() -> None:
    async with serve(None) as (port, seen):
        assert await call(rpc.insecure_channel(f"127.0.0.1:{port}"), WHOAMI) == b""
        assert seen == [None]


async def test_client_without_certificate_is_refused(certs: Path) -> None:
    ca = (certs / "ca.pem").read_bytes()
    async with serve(tls.TlsConfig.for_identity(certs, "dispatch")) as (port, seen):
        no_cert = grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca))
        assert await call(no_cert) == grpc.StatusCode.UNAVAILABLE
        plain = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        assert await call(plain, WHOAMI) == grpc.StatusCode.UNAVAILABLE
        assert seen == []


async def test_client_certificate_of_another_ca_is_refused(certs: Path, other_ca: Path) -> None:
    # Trusts our CA (so the server is accepted), presents the other CA's pair.
    stranger = tls.TlsConfig(
        certs / "ca.pem", tls.cert_path(other_ca, "dispatch"), tls.key_path(other_ca, "dispatch")
    )
    async with serve(tls.TlsConfig.for_identity(certs, "dispatch")) as (port, seen):
        assert await call(rpc.insecure_channel(f"127.0.0.1:{port}", stranger), WHOAMI) == (
            grpc.StatusCode.UNAVAILABLE
        )
        assert seen == []


async def test_server_certificate_must_name_the_dialed_ip(certs: Path) -> None:
    """gRPC checks an IP literal target against the IPAddress SANs (no
    target-name override): `dnsonly` is valid for localhost, not 127.0.0.1."""
    client = tls.TlsConfig.for_identity(certs, "schedule")
    async with serve(tls.TlsConfig.for_identity(certs, "dnsonly")) as (port, _):
        assert await call(rpc.insecure_channel(f"127.0.0.1:{port}", client)) == (
            grpc.StatusCode.UNAVAILABLE
        )
        assert await call(rpc.insecure_channel(f"localhost:{port}", client)) == (
            health_pb2.HealthCheckResponse.SERVING
        )


async def test_identity_interceptor_allows_components_only(certs: Path) -> None:
    asked: list[tuple[str, str | None]] = []

    def components_only(method: str, identity: str | None) -> bool:
        asked.append((method, identity))
        return identity in tls.COMPONENTS

    server = tls.TlsConfig.for_identity(certs, "dispatch")
    async with serve(server, components_only) as (port, seen):
        admin = tls.TlsConfig.for_identity(certs, tls.ADMIN)
        ch = rpc.insecure_channel(f"127.0.0.1:{port}", admin)
        try:
            await ch.unary_unary(WHOAMI)(b"", timeout=10)
            raise AssertionError("client/admin was allowed")
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED
            assert e.details() == (
                f"method {WHOAMI} needs a component certificate; "
                "the peer presented identity client/admin"
            )
        finally:
            await ch.close()
        assert seen == []  # refused before the handler ran
        dispatch = tls.TlsConfig.for_identity(certs, "dispatch")
        assert await call(rpc.insecure_channel(f"127.0.0.1:{port}", dispatch), WHOAMI) == (
            b"dispatch"
        )
        ch = rpc.insecure_channel(f"127.0.0.1:{port}", admin)
        assert await call(ch) == grpc.StatusCode.PERMISSION_DENIED  # health too
    assert asked == [(WHOAMI, "client/admin"), (WHOAMI, "dispatch"), (CHECK, "client/admin")]


# -- certificates -------------------------------------------------------------


def test_component_certificate_sans(certs: Path) -> None:
    cert = _cert(certs, "dispatch")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://galaxy/dispatch"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]  # no IP as a DNS name
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    assert tls.identity_of(cert) == "dispatch"
    cert.verify_directly_issued_by(_cert_ca(certs))
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 365 <= days <= 366
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


def _cert_ca(d: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())


def test_client_certificate_is_client_only(certs: Path) -> None:
    cert = _cert(certs, tls.ADMIN)
    assert (certs / "client" / "admin.pem").is_file()
    uris = ["spiffe://galaxy/client/admin"]
    assert tls.describe(cert)["identity"] == "client/admin"
    assert tls.describe(cert)["hosts"] == []
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == uris
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_ca_certificate(certs: Path) -> None:
    ca = _cert_ca(certs)
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca and bc.path_length == 0
    assert 3650 <= (ca.not_valid_after_utc - ca.not_valid_before_utc).days <= 3651


def test_ipv6_host_is_an_ip_san(tmp_path: Path) -> None:
    tls.ensure(tmp_path, ["gateway"], ["::1", "Galaxy.Example"])
    cert = _cert(tmp_path, "gateway")
    assert tls.describe(cert)["hosts"] == ["::1", "galaxy.example"]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("::1")]


@pytest.mark.parametrize(
    "bad",
    ["", "Dispatch", "a//b", "/etc/passwd", "../x", "a/", "a b", "x" * 101, "ca", "dispatch-key"],
)
def test_bad_identity_is_refused_by_name(tmp_path: Path, bad: str) -> None:
    tls.create_ca(tmp_path)
    with pytest.raises(ValueError, match=r"^identity ") as e:
        tls.issue(tmp_path, bad, [])
    assert repr(bad[:32]) in str(e.value)
    assert len(str(e.value)) < 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-key.pem", "ca.pem"]


def test_huge_identity_error_stays_short(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        tls.issue(tmp_path, "A" * 100_000, [])
    assert len(str(e.value)) < 200


def test_bad_host_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^host 'not a host'"):
        tls.ensure(tmp_path, ["dispatch"], ["not a host"])
    assert list(tmp_path.iterdir()) == []


def test_ensure_is_idempotent_and_repairs(tmp_path: Path, other_ca: Path) -> None:
    assert tls.ensure(tmp_path) == ["ca", *tls.DEFAULT_IDENTITIES, "lease-key", "route-key"]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.pem")}
    assert tls.ensure(tmp_path) == []
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.pem")} == before
    # Missing, foreign and host-lacking certificates are reissued, alone.
    tls.cert_path(tmp_path, "schedule").unlink()
    for suffix in (".pem", "-key.pem"):
        (tmp_path / f"gateway{suffix}").write_bytes((other_ca / f"dispatch{suffix}").read_bytes())
    assert tls.ensure(tmp_path) == ["schedule", "gateway"]
    assert tls.ensure(tmp_path, ["dispatch"], ["galaxy.example"]) == ["dispatch"]
    hosts = tls.describe(_cert(tmp_path, "dispatch"))["hosts"]
    assert sorted(hosts) == ["127.0.0.1", "::1", "galaxy.example", "localhost"]  # none dropped
    assert before[tmp_path / "ca.pem"] == (tmp_path / "ca.pem").read_bytes()


def test_rotate_replaces_key_keeps_hosts(tmp_path: Path) -> None:
    tls.ensure(tmp_path, ["dispatch"], ["localhost", "10.0.0.7"])
    old_key = tls.key_path(tmp_path, "dispatch").read_bytes()
    old = _cert(tmp_path, "dispatch")
    tls.rotate(tmp_path, "dispatch")
    new = _cert(tmp_path, "dispatch")
    assert tls.key_path(tmp_path, "dispatch").read_bytes() != old_key
    assert new.serial_number != old.serial_number
    assert tls.describe(new)["hosts"] == tls.describe(old)["hosts"] == ["localhost", "10.0.0.7"]
    assert stat.S_IMODE(tls.key_path(tmp_path, "dispatch").stat().st_mode) == 0o600


def test_key_files_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        tls.ensure(tmp_path)
    finally:
        os.umask(old)
    keys = sorted(tmp_path.rglob("*-key.pem"))
    assert len(keys) == 1 + len(tls.DEFAULT_IDENTITIES)
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((tmp_path / "ca.pem").stat().st_mode) == 0o644
    assert not [p for p in tmp_path.rglob(".*")]  # no temp file left behind


# -- `galaxy certs` -----------------------------------------------------------


def galaxy(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "certs", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_cli_init_then_show(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    r = galaxy("init", "--dir", str(d), "--host", "localhost", "--host", "127.0.0.1")
    assert r.returncode == 0, r.stderr
    r = galaxy("show", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ca ")
    by_identity = {line.split()[0]: line for line in lines[1:]}
    assert sorted(by_identity) == sorted(tls.DEFAULT_IDENTITIES)
    for identity in tls.DEFAULT_IDENTITIES:
        assert f"spiffe://galaxy/{identity}" in by_identity[identity]
        assert "not after" in by_identity[identity]
    assert "IP:127.0.0.1" in by_identity["dispatch"]
    assert "DNS:" not in by_identity["client/admin"]
    for key in d.rglob("*-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


@pytest.mark.slow
def test_cli_bad_identity_is_one_line_naming_it(tmp_path: Path) -> None:
    assert galaxy("init", "--dir", str(tmp_path)).returncode == 0
    r = galaxy("issue", "--dir", str(tmp_path), "Bad/ID")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("galaxy: identity 'Bad/ID'")
    r = galaxy("issue", "--dir", str(tmp_path), "x" * 10_000)
    assert r.returncode != 0 and len(r.stderr) < 300


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    r = galaxy("issue", "--dir", str(tmp_path / "none"), "dispatch")
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "no CA in" in r.stderr and "galaxy certs init" in r.stderr
    assert galaxy("init", "--dir", str(tmp_path)).returncode == 0
    r = galaxy("issue", "--dir", str(tmp_path), "dispatch")
    assert r.returncode != 0 and "use `galaxy certs rotate`" in r.stderr
    r = galaxy("rotate", "--dir", str(tmp_path), "client/alice")
    assert r.returncode != 0 and "does not exist" in r.stderr
    r = galaxy("issue", "--dir", str(tmp_path), "client/alice", "--host", "no such host")
    assert r.returncode != 0 and r.stderr.startswith("galaxy: host 'no such host'")
    assert r.stderr.count("\n") == 1


@pytest.mark.slow
def test_cli_show_flags_a_foreign_certificate(tmp_path: Path, other_ca: Path) -> None:
    assert galaxy("init", "--dir", str(tmp_path)).returncode == 0
    (tmp_path / "intruder.pem").write_bytes(tls.cert_path(other_ca, "dispatch").read_bytes())
    r = galaxy("show", "--dir", str(tmp_path))
    flagged = [line for line in r.stdout.splitlines() if "NOT ISSUED BY ca.pem" in line]
    assert len(flagged) == 1 and flagged[0].startswith("dispatch ")
    assert flagged[0].endswith("  [intruder.pem]")
