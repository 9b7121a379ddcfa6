"""Running `galaxy chaos` from a test: one real run, its JSON report, and the
check that every process it started is gone. Shared by the chaos test files
(split by fault family so that parallel workers share the runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.etcd_server import require_etcd
from tests.integration.upctl import REPO, pid_alive


def chaos(
    tmp_path: Path, *flags: str, etcd: bool = True
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run `galaxy chaos` with its own etcd (the binary the fixtures use)
    when the fault needs one."""
    out = tmp_path / "chaos.json"
    env = {**os.environ, "GALAXY_ETCD_BINARY": require_etcd()} if etcd else None
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "chaos", "--rate", "40", "--nodes", "2",
         "--out", str(out), *flags],
        capture_output=True, text=True, timeout=180, cwd=REPO, env=env,
    )  # fmt: skip
    assert out.exists(), r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    # Everything the run started is gone (kills and stops were by PID).
    assert not [p for p in rep["pids"] if pid_alive(p)]
    return rep, r
