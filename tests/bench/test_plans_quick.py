"""The shipped plans run end to end in their short form, `galaxy bench
--quick` (tests/bench/quickplans.py): one run of them all for this module,
on control planes shared between plans of the same configuration, and a
test per family of plans reading its plans' problems."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.bench.quickplans import DATA, QuickRuns, run_all, shipped

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLD = ("cold-burst.yaml", "cold-heartbeats.yaml", "cold-moonshot.yaml", "cold-streams.yaml")
WARM = (
    "stream-batches.yaml",
    "warm-dispatch.yaml",
    "warm-gc.yaml",
    "warm-nodes.yaml",
    "warm-streams.yaml",
)
STATE = ("ablation.yaml", "etcd-vs-memory.yaml")
TRACE = ("azure-replay.yaml",)


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory: pytest.TempPathFactory) -> QuickRuns:
    """Every family's plans run once, on shared control planes."""
    names = COLD + WARM + STATE + (TRACE if DATA.is_dir() else ())
    return asyncio.run(run_all(shipped(*names), tmp_path_factory.mktemp("quick")))


def _problems(runs: QuickRuns, names: tuple[str, ...]) -> list[str]:
    return [p for n in names for p in runs.problems[n]]


@pytest.mark.timeout(900)
def test_the_cold_start_plans_run_in_their_short_form(quick_runs: QuickRuns) -> None:
    found = _problems(quick_runs, COLD)
    assert found == [], "\n\n".join(found)


@pytest.mark.timeout(900)
def test_the_warm_path_plans_run_in_their_short_form(quick_runs: QuickRuns) -> None:
    found = _problems(quick_runs, WARM)
    assert found == [], "\n\n".join(found)


@pytest.mark.timeout(900)
def test_the_ablation_and_etcd_vs_memory_plans_run_in_their_short_form(
    quick_runs: QuickRuns,
) -> None:
    found = _problems(quick_runs, STATE)
    assert found == [], "\n\n".join(found)


@pytest.mark.timeout(900)
def test_the_trace_replay_plan_runs_in_its_short_form(quick_runs: QuickRuns) -> None:
    if not DATA.is_dir():
        pytest.skip(f"trace data not found at {DATA} (the shared/ folder next to the repo)")
    found = _problems(quick_runs, TRACE)
    assert found == [], "\n\n".join(found)


def test_plans_of_one_configuration_share_a_control_plane(quick_runs: QuickRuns) -> None:
    # In their short form all but two resolve to one configuration: the
    # ablation turns the caches off, warm-gc the GC tuning.
    assert quick_runs.planes == 3
    # Each run deletes its functions: the next finds the controller's
    # function limit (500) as a fresh control plane has it.
    assert {n: f for n, f in quick_runs.left_after.items() if f} == {}


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
