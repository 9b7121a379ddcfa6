"""Warm-up and locality-aware placement under a real `galaxy up` (3 nodes,
process sandboxes, a real HTTP store): `galaxy deploy` of a spec with
``model.warm: {nodes: 1}`` fetches the model to one node chosen by
placement; `galaxy models status` shows it there; the scale-ups of the
function then land on that node with locality on, and spread with
`--no-locality` (Schedule's least_loaded alone)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.integration.upctl import REPO, GalaxyUp
from tests.models.store import CountingStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MIB = 1 << 20
SCALE = 4


def _spec(path: Path, uri: str, sha: str, size: int, min_scale: int) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "llm", "public": True, "runtime": "python",
        "artifact": str(REPO / "examples" / "model_info.py"),
        "model": {"uri": uri, "format": "bin", "sha256": sha, "size_bytes": size,
                  "warm": {"nodes": 1}},
        "resources": {"cpu_millis": 250, "memory_mib": 256},
        "readiness_path": "/healthz", "min_scale": min_scale, "max_scale": SCALE,
    }))  # fmt: skip
    return path


def _until(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """Poll a CLI-observed condition (the state lives in other processes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("locality", [True, False], ids=["locality", "blind"])
def test_scale_ups_land_where_the_model_was_warmed(tmp_path: Path, locality: bool) -> None:
    root = tmp_path / "store"
    root.mkdir()
    data = os.urandom(64 * MIB)  # 0.5 s over 1 Gbit/s: worth a node's free fraction
    (root / "m.bin").write_bytes(data)
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    store = CountingStore(root)
    flags = ("--nodes", "3", *(() if locality else ("--no-locality",)))
    g = GalaxyUp(tmp_path / "run", *flags)
    g.start()
    try:
        uri = store.url("m.bin")
        r = g.cli("deploy", "-f", str(_spec(tmp_path / "a.yaml", uri, sha, size, 0)))
        assert r.returncode == 0 and "fetched, in the disk tier" in r.stdout, r.stdout + r.stderr
        warmed = r.stdout.split("fetched, in the")[0].splitlines()[-1].split(":")[0]
        assert store.gets["/m.bin"] == 1

        def holders() -> list[dict]:
            out = g.cli("models", "status", "llm", "-o", "json")
            assert out.returncode == 0, out.stderr
            return [h for h in json.loads(out.stdout) if h["tier"] in ("disk", "memory")]

        held = _until("the warmed node's status", holders)
        assert [h["node"] for h in held] == [warmed] and held[0]["size_bytes"] == size
        r = g.cli("models", "warm", "llm", "--nodes", "0")
        assert r.returncode != 0 and "nodes: 1 to" in r.stderr, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        # Warming again is a no-op: the node holds it.
        r = g.cli("models", "warm", "llm", "--nodes", "1")
        assert r.returncode == 0 and "holds llm's model already" in r.stdout, r.stdout

        # min_scale SCALE: SCALE scale-ups, each placed by Schedule.
        r = g.cli("deploy", "-f", str(_spec(tmp_path / "b.yaml", uri, sha, size, SCALE)))
        assert r.returncode == 0, r.stdout + r.stderr

        def placed() -> Counter[str] | None:
            status = json.loads(g.cli("status", "--json").stdout)
            nodes = [i["instance"]["node_id"] for i in status.get("instances", [])
                     if i["instance"]["function"].startswith("llm")]  # fmt: skip
            return Counter(nodes) if len(nodes) >= SCALE else None

        on = _until("the scale-ups", placed, timeout=120.0)
        print(f"locality={locality}: placements by node {dict(on)}, warmed {warmed}")
        if locality:
            assert on[warmed] >= 0.8 * SCALE, on
        else:
            assert on[warmed] < SCALE, on  # spread by load
    finally:
        g.stop()
        store.close()
