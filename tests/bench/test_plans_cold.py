"""The shipped cold-start plans (cold-*) run end to end in their short
form, `galaxy bench --quick` (tests/bench/quickplans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.quickplans import run_all, shipped

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_the_cold_start_plans_run_in_their_short_form(tmp_path: Path) -> None:
    plans = shipped(
        "cold-burst.yaml",
        "cold-heartbeats.yaml",
        "cold-moonshot.yaml",
        "cold-streams.yaml",
    )
    found = run_all(plans, tmp_path)
    assert found == [], "\n\n".join(found)
