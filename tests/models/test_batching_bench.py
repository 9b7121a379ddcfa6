"""The batching bench plan (``kind: batching``): its file, its checks, the
verdict, and a short run of the shipped plan through `galaxy bench` under a
real `galaxy up` (speeds are the verdict's business, not this test's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.bench import batching
from tests.models.benchrun import short_run

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_plan_loads() -> None:
    doc = yaml.safe_load((REPO / "experiments" / "batching.yaml").read_text())
    plan = batching.load_plan(doc)
    assert plan is not None and plan["runs"] == 3 and plan["max_latency_ms"] == 10
    assert batching.load_plan({"kind": "llm"}) is None


@pytest.mark.parametrize(
    ("block", "field"),
    [({"runs": 0}, "batching.runs"), ({"seconds": "x"}, "batching.seconds"),
     ({"workers": 3}, "batching.workers"), ({"max_batch_size": 2.5}, "batching.max_batch_size")],
)  # fmt: skip
def test_a_bad_field_is_named(block: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        batching.load_plan({"kind": "batching", "batching": block})


def _run(x: float, xb: float, p99_x: float, p99_2x: float, errors: int = 0) -> dict:
    lat = {"p99_ms": 1.0, "errors": 0}
    return {
        "saturation_per_s": {"without": x, "with": xb},
        "without_at_half_x": lat,
        "without_at_x": {"p99_ms": p99_x, "errors": 0},
        "with_at_2x": {"p99_ms": p99_2x, "errors": errors},
    }


def test_the_verdict_names_each_goal_missed() -> None:
    ok = batching.judge([_run(100, 300, 9.0, 8.0)])
    assert ok["goals_missed"] == [] and ok["throughput_ratio"] == 3.0
    bad = batching.judge([_run(100, 150, 5.0, 8.0, errors=2)])
    assert len(bad["goals_missed"]) == 3
    assert "1.50x" in bad["goals_missed"][0] and "8.00 ms > without at X 5.00" in bad[
        "goals_missed"][1]  # fmt: skip


@pytest.mark.slow
def test_the_shipped_plan_runs_in_a_short_form(tmp_path: Path) -> None:
    rc, report = short_run("batching.yaml", tmp_path, "batching", runs=1, seconds=1,
                           closed_workers=8)  # fmt: skip
    (run,) = report["runs"]
    assert run["saturation_per_s"]["without"] > 0 and run["saturation_per_s"]["with"] > 0
    assert (rc == 1) == bool(report["verdict"]["goals_missed"])
