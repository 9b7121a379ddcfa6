"""A shipped bench file of its own kind (model cold start, batching) in a
short form, through `galaxy bench` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def short_run(shipped: str, tmp_path: Path, block: str, **changes: Any) -> tuple[int, dict]:
    """experiments/SHIPPED with ``changes`` in its ``block``: (exit code, the
    results). 0 or 1 (a goal missed) only, and never a traceback."""
    doc = yaml.safe_load((REPO / "experiments" / shipped).read_text())
    doc[block] = dict(doc[block], **changes)
    f = tmp_path / shipped
    f.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "bench", "-f", str(f), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert (out / "report.md").read_text().strip()
    return r.returncode, json.loads((out / "results.json").read_text())
