"""The shipped cold-start plans (ablation, cold-*) run end to end in their short
form, `galaxy bench --quick` (tests/bench/quickplans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.quickplans import run_all, shipped

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_the_cold_start_plans_run_in_their_short_form(tmp_path: Path) -> None:
    plans = shipped(
        "ablation.yaml",
        "cold-burst.yaml",
        "cold-heartbeats.yaml",
        "cold-moonshot.yaml",
        "cold-streams.yaml",
    )
    assert run_all(plans, tmp_path) == []
