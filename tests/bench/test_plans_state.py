"""The shipped ablation, state and trace plans (ablation, etcd-vs-memory,
azure-replay) run end to end in their short form, `galaxy bench --quick`
(tests/bench/quickplans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.quickplans import DATA, run_all, shipped

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_the_ablation_and_etcd_vs_memory_plans_run_in_their_short_form(tmp_path: Path) -> None:
    found = run_all(shipped("ablation.yaml", "etcd-vs-memory.yaml"), tmp_path)
    assert found == [], "\n\n".join(found)


@pytest.mark.timeout(600)
def test_the_trace_replay_plan_runs_in_its_short_form(tmp_path: Path) -> None:
    if not DATA.is_dir():
        pytest.skip(f"trace data not found at {DATA} (the shared/ folder next to the repo)")
    found = run_all(shipped("azure-replay.yaml"), tmp_path)
    assert found == [], "\n\n".join(found)


def test_every_shipped_plan_has_a_short_run() -> None:
    here = Path(__file__).parent
    tested = "".join(p.read_text() for p in here.glob("test_plans_*.py"))
    tested += (here / "test_smoke.py").read_text()
    # Bench files of their own kinds have their short runs beside their code.
    tests = here.parent
    for other in (
        "llm/test_bench_e2e.py",
        "llm/test_real_model.py",
        "models/test_bench_plan.py",
        "models/test_batching_bench.py",
    ):
        tested += (tests / other).read_text()
    shipped_names = sorted(p.name for p in (here.parents[1] / "experiments").glob("*.yaml"))
    # Needs vLLM's own virtualenv and minutes of engine start: the vllm tier
    # (tests/llm/test_vllm.py) runs vLLM itself; the plan is run by hand
    # (docs/llm.md, "vLLM on CPU").
    by_hand = {"llm-azure-vllm.yaml"}
    assert [n for n in shipped_names if f'{n}"' not in tested and n not in by_hand] == []
