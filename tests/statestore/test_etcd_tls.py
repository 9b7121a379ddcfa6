"""etcd with TLS and client-certificate authentication: the store talks TLS to
an etcd that requires a client certificate (``--client-cert-auth``), a client
without a certificate or over plaintext is refused, and the file variables are
checked with errors naming them. A real etcd of its own, certificates from
Galaxy's own CA code."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from controlplane.runtime import tls
from statestore import StoreError, open_store
from statestore.etcd_tls import EtcdTls
from tests.etcd_server import EtcdServer


def _certs(d: Path) -> Path:
    tls.create_ca(d)
    tls.issue(d, "etcd", ["127.0.0.1"])
    tls.issue(d, "client/etcd-health", [])
    tls.issue(d, "client/galaxy", [])
    return d


def tls_env(d: Path, client: bool = True) -> dict[str, str]:
    """The GALAXY_ETCD_* variables for the files in d."""
    env = {"GALAXY_ETCD_CA": str(d / "ca.pem")}
    if client:
        env["GALAXY_ETCD_CERT"] = str(d / "client" / "galaxy.pem")
        env["GALAXY_ETCD_KEY"] = str(d / "client" / "galaxy-key.pem")
    return env


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("etcd-tls")
    server = EtcdServer(base / "data", tls_dir=_certs(base / "certs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _setenv(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for var in ("GALAXY_ETCD_CA", "GALAXY_ETCD_CERT", "GALAXY_ETCD_KEY"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


async def test_store_over_tls_with_client_cert_reads_writes_and_watches(
    tls_etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_etcd.tls_dir is not None
    _setenv(monkeypatch, tls_env(tls_etcd.tls_dir))
    store = open_store(tls_etcd.url)
    try:
        watch = store.watch_prefix("/galaxy/tls/")
        await watch.started()
        await store.put("/galaxy/tls/a", b"secret spec")
        kv = await store.get("/galaxy/tls/a")
        assert kv is not None and kv.value == b"secret spec"
        event = await asyncio.wait_for(anext(watch), 10)
        assert event.key == "/galaxy/tls/a"
        lease = await store.grant_lease(5)
        await store.revoke_lease(lease)
        await watch.aclose()
    finally:
        await store.close()


async def test_no_client_certificate_is_refused(
    tls_etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_etcd.tls_dir is not None
    _setenv(monkeypatch, tls_env(tls_etcd.tls_dir, client=False))
    store = open_store(tls_etcd.url)
    try:
        with pytest.raises(StoreError):
            await store.put("/galaxy/tls/b", b"v")
    finally:
        await store.close()


async def test_plaintext_client_gets_nothing_from_a_tls_etcd(
    tls_etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setenv(monkeypatch, {})
    store = open_store(f"etcd://{tls_etcd.endpoint}")
    try:
        with pytest.raises(StoreError):
            await store.get("/galaxy/tls/a")
    finally:
        await store.close()


def test_files_and_scheme_are_checked_naming_the_variable(tmp_path: Path, monkeypatch) -> None:
    d = _certs(tmp_path)
    env = tls_env(d)
    del env["GALAXY_ETCD_KEY"]
    with pytest.raises(ValueError, match="GALAXY_ETCD_KEY"):
        EtcdTls.from_env(env)
    with pytest.raises(ValueError, match="GALAXY_ETCD_CA: cannot read"):
        EtcdTls.from_env({"GALAXY_ETCD_CA": str(tmp_path / "missing.pem")})
    # Certificates given with a plaintext URL: refused, not silently ignored.
    _setenv(monkeypatch, tls_env(d))
    with pytest.raises(ValueError, match="etcds://"):
        open_store("etcd://127.0.0.1:2379")


def test_etcdctl_reads_what_galaxy_wrote_over_tls(tls_etcd: EtcdServer, monkeypatch) -> None:
    """A client we did not write sees the same key space over TLS."""
    assert tls_etcd.tls_dir is not None
    d = tls_etcd.tls_dir
    _setenv(monkeypatch, tls_env(d))

    async def write() -> None:
        store = open_store(tls_etcd.url)
        try:
            await store.put("/galaxy/tls/ctl", b"from-galaxy")
        finally:
            await store.close()

    asyncio.run(write())
    r = subprocess.run(
        ["etcdctl", f"--endpoints=https://{tls_etcd.endpoint}", f"--cacert={d / 'ca.pem'}",
         f"--cert={d / 'client' / 'galaxy.pem'}", f"--key={d / 'client' / 'galaxy-key.pem'}",
         "get", "/galaxy/tls/ctl", "--print-value-only"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "from-galaxy"


@pytest.mark.integration
@pytest.mark.slow
def test_control_plane_runs_on_a_client_cert_etcd(tls_etcd: EtcdServer, tmp_path, monkeypatch):
    """`galaxy up --state etcds://` against etcd with --client-cert-auth: a
    deploy is stored (read back over TLS by etcdctl) and an invocation runs."""
    from tests.integration.upctl import REPO, GalaxyUp

    assert tls_etcd.tls_dir is not None
    d = tls_etcd.tls_dir
    _setenv(monkeypatch, tls_env(d))  # children inherit the environment
    g = GalaxyUp(tmp_path / "run", "--nodes", "1", "--state", tls_etcd.url)
    g.start()
    try:
        r = g.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
        assert r.returncode == 0, r.stderr
        r = g.cli("invoke", "echo", "--data", "over-tls")
        assert r.returncode == 0 and "HTTP 200" in r.stdout, r.stdout + r.stderr
        r = g.cli("store", "dump", "--state", tls_etcd.url)
        assert r.returncode == 0, r.stderr
        assert "echo" in r.stdout
    finally:
        pids = g.pids()
        g.stop()
        assert not g.kill_leftovers(pids)
