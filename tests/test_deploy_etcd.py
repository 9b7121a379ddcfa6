"""deploy/etcd/etcd.yaml: the schema (kubernetes-validate, strict), the same
hardening as the Galaxy workloads, and the configuration itself run for real:
three local etcd members started with exactly the manifest's flags (pod DNS
names and paths mapped to loopback ports and a temp dir) form a TLS cluster
that requires client certificates, and Galaxy's store reads and writes
through it over etcds:// with a component certificate."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from controlplane.runtime import tls
from statestore import StoreError, open_store
from tests.etcd_server import _free_port, require_etcd
from tests.test_deploy import CONTAINER_CONTEXT, K8S_VERSION, POD_CONTEXT, _require

ETCD_YAML = Path(__file__).resolve().parents[1] / "deploy" / "etcd" / "etcd.yaml"


def docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(ETCD_YAML.read_text()) if d]


def statefulset() -> dict:
    (s,) = [d for d in docs() if d["kind"] == "StatefulSet"]
    return s


@pytest.mark.parametrize("doc", docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_validates_against_the_kubernetes_schema(doc: dict) -> None:
    kubernetes_validate = _require("kubernetes_validate")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")


def test_hardened_like_the_galaxy_workloads() -> None:
    s = statefulset()
    spec = s["spec"]["template"]["spec"]
    assert spec["securityContext"] == POD_CONTEXT
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["securityContext"] == CONTAINER_CONTEXT
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == 2381, probe
    assert c["command"][0] == "etcd"
    args = c["command"][1:]
    # TLS with client certificates on both the client and the peer port.
    for flag in ("--client-cert-auth=true", "--peer-client-cert-auth=true"):
        assert flag in args
    assert "--listen-client-urls=https://0.0.0.0:2379" in args
    assert s["spec"]["replicas"] == 3
    (pdb,) = [d for d in docs() if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1  # a quorum of 2 of 3 stays


def _member_args(
    args: list[str], i: int, ports: list[tuple[int, int, int]], tmp: Path
) -> list[str]:
    """The manifest's flags for member i, pod DNS names and paths mapped here."""
    name = f"etcd-{i}"
    out = []
    for a in args:
        a = a.replace("$(POD_NAME)", name)
        for j, (client, peer, _) in enumerate(ports):
            host = f"etcd-{j}.etcd-peers.galaxy.svc"
            a = a.replace(f"{host}:2380", f"127.0.0.1:{peer}")
            a = a.replace(f"{host}:2379", f"127.0.0.1:{client}")
        client, peer, metrics = ports[i]
        a = a.replace("0.0.0.0:2379", f"127.0.0.1:{client}")
        a = a.replace("0.0.0.0:2380", f"127.0.0.1:{peer}")
        a = a.replace("0.0.0.0:2381", f"127.0.0.1:{metrics}")
        a = a.replace("/etc/etcd/tls", str(tmp / "certs"))
        a = a.replace("/var/lib/etcd", str(tmp / name))
        out.append(a)
    assert not [a for a in out if "galaxy.svc" in a or "$(" in a], out
    return out


def _healthy(url: str, tmp: Path) -> None:
    """Poll a member's plaintext /health (an external process: no event to
    await) until the cluster has a leader."""
    for _ in range(300):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if b'"health":"true"' in r.read().replace(b" ", b""):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    logs = "\n".join(p.read_text()[-1500:] for p in tmp.glob("etcd-*.log"))
    raise AssertionError(f"{url} not healthy:\n{logs}")


async def _store_checks(certs: Path, ports: list[tuple[int, int, int]], monkeypatch) -> None:
    monkeypatch.setenv("GALAXY_ETCD_CA", str(certs / "ca.pem"))
    monkeypatch.setenv("GALAXY_ETCD_CERT", str(certs / "dispatch.pem"))
    monkeypatch.setenv("GALAXY_ETCD_KEY", str(certs / "dispatch-key.pem"))
    endpoints = ",".join(f"127.0.0.1:{client}" for client, _, _ in ports)
    store = open_store(f"etcds://{endpoints}")
    try:
        await store.put("/galaxy/deploy-test", b"replicated")
        kv = await store.get("/galaxy/deploy-test")
        assert kv is not None and kv.value == b"replicated"
    finally:
        await store.close()
    # Without a client certificate the cluster refuses the connection.
    monkeypatch.delenv("GALAXY_ETCD_CERT")
    monkeypatch.delenv("GALAXY_ETCD_KEY")
    store = open_store(f"etcds://127.0.0.1:{ports[0][0]}")
    try:
        with pytest.raises(StoreError):
            await store.get("/galaxy/deploy-test")
    finally:
        await store.close()


@pytest.mark.slow
def test_the_manifest_configuration_forms_a_tls_cluster(tmp_path: Path, monkeypatch) -> None:
    binary = require_etcd()
    certs = tmp_path / "certs"
    tls.create_ca(certs)
    # As the manifest's header says, with the loopback names this test uses.
    tls.issue(certs, "etcd", ["etcd.galaxy.svc", "*.etcd-peers.galaxy.svc", "127.0.0.1"])
    tls.issue(certs, "dispatch", ["127.0.0.1"])
    (c,) = statefulset()["spec"]["template"]["spec"]["containers"]
    ports = [(_free_port(), _free_port(), _free_port()) for _ in range(3)]
    procs, logs = [], []
    try:
        for i in range(3):
            log = open(tmp_path / f"etcd-{i}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(
                [binary, *_member_args(c["command"][1:], i, ports, tmp_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            ))  # fmt: skip
        for _, _, metrics in ports:
            _healthy(f"http://127.0.0.1:{metrics}/health", tmp_path)
        asyncio.run(_store_checks(certs, ports, monkeypatch))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for log in logs:
            log.close()
