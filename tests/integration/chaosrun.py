"""Running `galaxy chaos` from a test: one real run (of one fault or
several), its JSON report, and the check that every process it started is
gone. Shared by the chaos test files (split by fault family so that
parallel workers share the runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.etcd_server import require_etcd
from tests.integration.upctl import REPO, pid_alive

#: What the control plane's logs say about starts and nodes: the lines a
#: failed run is explained by (who gave a start up, which never became
#: ready, which node was declared dead or restarted).
TELLING = (
    "given up", "did not become ready", "in doubt", "cannot start", "is dead", "restarted",
    "did not answer a probe", "was deleted while it was starting", "not usable",
)  # fmt: skip


def log_digest(run_dir: Path, limit: int = 40) -> str:
    """The telling lines of a kept run directory's component logs, oldest
    first, each cut short, at most ``limit`` (with the count of each kind)."""
    lines: list[tuple[str, str, str]] = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        for raw in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            msg = str(rec.get("message", ""))
            if any(t in msg for t in TELLING):
                lines.append((str(rec.get("time", "")), log.stem, msg))
    lines.sort()
    counts = {t: sum(t in m for _, _, m in lines) for t in TELLING}
    lines = [(t, name, m[:200]) for t, name, m in lines]
    head = ", ".join(f"{t!r}: {n}" for t, n in counts.items() if n)
    body = "\n".join(" ".join(x) for x in lines[:limit])
    return f"{head or 'no telling lines'}\n{body}"


#: A run's own bound (its load and faults are bounded; this is the backstop).
RUN_TIMEOUT_S = 180.0


def chaos(
    tmp_path: Path, *flags: str, etcd: bool = True, timeout_s: float = RUN_TIMEOUT_S
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run `galaxy chaos` with its own etcd (the binary the fixtures use)
    when the fault needs one; its run directory (the components' logs) is
    kept under tmp_path/run."""
    out = tmp_path / "chaos.json"
    env = {**os.environ, "GALAXY_ETCD_BINARY": require_etcd()} if etcd else None
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "chaos", "--rate", "40", "--nodes", "2",
         "--out", str(out), "--run-dir", str(tmp_path / "run"), *flags],
        capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env,
    )  # fmt: skip
    assert out.exists(), r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    # Everything the run started is gone (kills and stops were by PID).
    assert not [p for p in rep["pids"] if pid_alive(p)]
    return rep, r


def by_fault(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run of several faults: each fault's own report, by fault name."""
    return {f["fault"]: f for f in rep["faults"]}
