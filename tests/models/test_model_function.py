"""A function with a model under a real `galaxy up` (process sandboxes):
the node agent fetches the model from a real HTTP store into its cache,
the instance reads it from $GALAXY_MODEL_PATH, a second cold start does not
download it again, and a model whose checksum does not match never starts
an instance (a clear error, no traceback)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from tests.integration.upctl import REPO, GalaxyUp
from tests.models.store import CountingStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _spec(path: Path, name: str, uri: str, sha: str) -> Path:
    path.write_text(yaml.safe_dump({
        "name": name, "public": True, "runtime": "python",
        "artifact": str(REPO / "examples" / "model_info.py"),
        "model": {"uri": uri, "format": "bin", "sha256": sha},
        "readiness_path": "/healthz", "max_scale": 2,
    }))  # fmt: skip
    return path


def test_a_function_serves_the_model_its_node_fetched(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    data = os.urandom(512 * 1024)
    (root / "weights.bin").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    store = CountingStore(root)
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        spec = _spec(tmp_path / "m.yaml", "weights", store.url("weights.bin"), sha)
        assert g.cli("deploy", "-f", str(spec)).returncode == 0
        r = g.cli("invoke", "weights", "--data", "x")
        assert r.returncode == 0 and "(cold" in r.stdout, r.stdout + r.stderr
        body = json.loads(r.stdout.split("HTTP 200: ", 1)[1])
        assert body["model_sha256"] == sha and body["model_bytes"] == len(data)
        assert sha in body["model_path"]  # the cache's file, not the store's
        # Deleted and deployed again: a new cold start, the model from the cache.
        assert g.cli("delete", "weights").returncode == 0
        assert g.cli("deploy", "-f", str(spec)).returncode == 0
        r = g.cli("invoke", "weights", "--data", "x")
        assert r.returncode == 0 and "(cold" in r.stdout, r.stdout + r.stderr
        assert store.gets["/weights.bin"] == 1
        # The wrong checksum: refused before any instance starts.
        bad = _spec(tmp_path / "bad.yaml", "corrupt", store.url("weights.bin"), "0" * 64)
        assert g.cli("deploy", "-f", str(bad)).returncode == 0
        r = g.cli("invoke", "corrupt", "--data", "x", "--timeout", "5")
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        status = json.loads(g.cli("status", "--json").stdout)
        assert not [i for i in status.get("instances", [])
                    if i["instance"]["function"] == "corrupt"]  # fmt: skip
        # Named where the start was refused (Schedule/Dispatch log the cause).
        logs = "".join(p.read_text() for p in (g.run_dir / "logs").glob("*.log"))
        assert "FAILED_PRECONDITION: model" in logs and "sha256 mismatch" in logs
    finally:
        g.stop()
        store.close()
