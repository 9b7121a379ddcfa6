"""The fault suite: kill -9 of a control function under load loses no
request (SDK failover, supervision), through `galaxy chaos` itself; and the
report's arithmetic (pure)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controlplane.tools.chaos import Outcome, report
from tests.integration.upctl import REPO

pytestmark = pytest.mark.integration


def test_report_counts_failures_gaps_and_latency_around_the_fault() -> None:
    out = Outcome()
    out.rows = [(0.0, 0.010, ""), (1.0, 0.020, ""), (2.0, 0.5, "UNAVAILABLE"), (3.0, 0.030, "")]
    rep = report(out, at_s=1.5, fault="dispatch", victim="dispatch-0", back=True)
    assert (rep["requests"], rep["failed"], rep["errors"]) == (4, 1, {"UNAVAILABLE": 1})
    assert rep["longest_gap_s"] == pytest.approx(2.01)  # 1.02 -> 3.03
    assert rep["p50_ms_before"] == pytest.approx(15.0)


@pytest.mark.parametrize("fault", ["dispatch", "schedule"])
def test_kill_9_under_load_loses_no_request(fault: str, tmp_path) -> None:
    out = tmp_path / "chaos.json"
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "chaos", "--fault", fault,
         "--rate", "40", "--duration-s", "8", "--at-s", "3", "--nodes", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    rep = json.loads(out.read_text())
    assert rep["requests"] == 320
    assert rep["victim"].startswith(fault) and rep["victim_back"], r.stdout[-2000:]
    assert rep["failed"] == 0, rep["errors"]
    assert r.returncode == 0
