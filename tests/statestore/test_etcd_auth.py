"""etcd with authentication on: the store connects with a user and password
from the environment (never from the URL), and without them it fails with
an error instead of hanging. A real etcd of its own (auth would break the
shared one), set up with etcdctl."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from statestore import StoreError, etcd_credentials, open_store
from tests.etcd_server import EtcdServer

PASSWORD = "s3cret-for-tests"


def _etcdctl(server: EtcdServer, *args: str) -> None:
    r = subprocess.run(
        ["etcdctl", f"--endpoints={server.endpoint}", *args],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


@pytest.fixture
def auth_etcd(tmp_path: Path):
    if shutil.which("etcdctl") is None:
        if os.environ.get("CI"):
            pytest.fail("etcdctl is missing; .ci/run installs etcd-client")
        pytest.skip("needs etcdctl (Debian etcd-client)")
    server = EtcdServer(tmp_path / "data")
    server.start()
    try:
        _etcdctl(server, "user", "add", "root", f"--new-user-password={PASSWORD}")
        _etcdctl(server, "auth", "enable")
        yield server
    finally:
        server.stop()


async def test_store_with_credentials_reads_and_writes(auth_etcd, monkeypatch) -> None:
    monkeypatch.setenv("GALAXY_ETCD_USER", "root")
    monkeypatch.setenv("GALAXY_ETCD_PASSWORD", PASSWORD)
    store = open_store(auth_etcd.url)
    try:
        await store.put("/galaxy/auth-test", b"v")
        kv = await store.get("/galaxy/auth-test")
        assert kv is not None and kv.value == b"v"
    finally:
        await store.close()


async def test_store_without_credentials_is_refused(auth_etcd, monkeypatch) -> None:
    monkeypatch.delenv("GALAXY_ETCD_USER", raising=False)
    monkeypatch.delenv("GALAXY_ETCD_PASSWORD", raising=False)
    store = open_store(auth_etcd.url)
    try:
        with pytest.raises(StoreError):
            await store.put("/galaxy/auth-test", b"v")
    finally:
        await store.close()


def test_credentials_come_in_pairs_and_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    env = {"GALAXY_ETCD_USER": "root", "GALAXY_ETCD_PASSWORD_FILE": str(secret)}
    assert etcd_credentials(env) == ("root", PASSWORD)
    assert etcd_credentials({}) == (None, None)
    with pytest.raises(ValueError) as e:
        etcd_credentials({"GALAXY_ETCD_USER": "root"})
    assert "GALAXY_ETCD_PASSWORD" in str(e.value)
    with pytest.raises(ValueError) as e:
        etcd_credentials({**env, "GALAXY_ETCD_PASSWORD_FILE": str(tmp_path / "missing")})
    assert "GALAXY_ETCD_PASSWORD_FILE" in str(e.value) and PASSWORD not in str(e.value)
