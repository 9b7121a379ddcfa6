"""The shipped warm-path plans (warm-*, stream-batches) run end to end in their short
form, `galaxy bench --quick` (tests/bench/quickplans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.quickplans import run_all, shipped

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_the_warm_path_plans_run_in_their_short_form(tmp_path: Path) -> None:
    plans = shipped(
        "stream-batches.yaml",
        "warm-dispatch.yaml",
        "warm-gc.yaml",
        "warm-nodes.yaml",
        "warm-streams.yaml",
    )
    found = run_all(plans, tmp_path)
    assert found == [], "\n\n".join(found)
