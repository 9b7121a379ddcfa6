"""The model cold-start bench plan: its file, and how a report is judged
against the plan's goals (the measurement itself: bench/models.py, root)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.bench import models

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_plan_loads_with_its_goals() -> None:
    doc = yaml.safe_load((REPO / "experiments" / "model-cold-start.yaml").read_text())
    plan = models.load_plan(doc)
    assert plan is not None
    assert (plan["size_mb"], plan["rate_mbit"], plan["trials"]) == (250, 1000.0, 3)
    assert plan["goals"]["disk"] == {"min_speedup": 5.0, "max_x_floor": 1.5}


def test_other_bench_files_are_not_model_plans() -> None:
    doc = yaml.safe_load((REPO / "experiments" / "smoke.yaml").read_text())
    assert models.load_plan(doc) is None


@pytest.mark.parametrize(
    ("block", "field"),
    [({"size_mb": -1}, "model.size_mb"), ({"sizes": 1}, "model.sizes"),
     ({"trials": True}, "model.trials")],
)  # fmt: skip
def test_a_bad_field_is_named(block: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        models.load_plan({"kind": models.PLAN_KIND, "model": block})


def test_a_report_is_judged_against_the_goals() -> None:
    report = {
        "x_floor": {"store": 1.01, "disk": 5.0, "memory": 1.7},
        "speedup_vs_store": {"disk": 5.7, "memory": 80.0},
    }
    goals = {
        "store": {"min_speedup": 0.0, "max_x_floor": 1.5},
        "disk": {"min_speedup": 5.0, "max_x_floor": 1.5},
        "memory": {"min_speedup": 10.0, "max_x_floor": 1.5},
    }
    missed = models.misses(report, goals)
    assert missed == [
        "disk: 5.00x its floor (goal <= 1.5x)",
        "memory: 1.70x its floor (goal <= 1.5x)",
    ]


@pytest.mark.slow
def test_the_shipped_plan_runs_in_a_short_form(tmp_path: Path) -> None:
    """model-cold-start.yaml with an 8 MiB model and one trial, through
    `galaxy bench`: a real store behind a shaped link, each tier measured
    and judged (speeds are the goals' business, not this test's)."""
    from tests.models.benchrun import short_run
    from tests.netns import require_netns

    require_netns()
    rc, report = short_run("model-cold-start.yaml", tmp_path, "model", size_mb=8, trials=1)
    assert report["size_bytes"] == 8 << 20
    assert set(report["seconds"]) == {"store", "disk", "memory"}
    assert (rc == 1) == bool(report["goals_missed"])  # the exit code is the verdict
