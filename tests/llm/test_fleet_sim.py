"""The 210-node LLM fleet simulator, run small: every request ends done or
refused, model-locality placement loads weights from a node's cache where a
placement blind to them goes back to the store, the central router's
decision cost delays first tokens, and a seed fixes the result."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from simulator.llm_fleet import FleetSim, Outcome, Policy, policies
from simulator.llm_fleet_cli import main
from simulator.llm_fleet_workload import LARGE, TRACES, FleetShape, Job, workload

needs_trace = pytest.mark.skipif(
    not all(p.exists() for p in TRACES), reason="the Azure LLM trace is not in ../shared/data"
)
SHAPE = FleetShape(nodes=12)
FUNCTIONS = 8


def small() -> list[Job]:
    return workload(minutes=1.0, functions=FUNCTIONS, speed=3.0, seed=7)


def run(p: Policy, jobs: list[Job], decision_s: float = 0.001) -> Outcome:
    return FleetSim(p, FUNCTIONS, LARGE, SHAPE, decision_s=decision_s, seed=7).run(jobs)


@needs_trace
def test_workload_is_skewed_and_time_scaled() -> None:
    jobs = small()
    per = [sum(1 for j in jobs if j.function == f) for f in range(FUNCTIONS)]
    assert per[0] == max(per) and per[-1] < per[0] / 2  # Zipf: rank 0 the most popular
    assert all(a.arrive <= b.arrive for a, b in itertools.pairwise(jobs))
    # Three minutes of trace compressed into one simulated minute.
    assert 55.0 < jobs[-1].arrive <= 60.0
    assert len(jobs) > 2 * len(workload(minutes=1.0, functions=FUNCTIONS, speed=1.0))


@pytest.mark.slow
@needs_trace
def test_every_request_is_accounted_and_locality_avoids_store_loads() -> None:
    jobs = small()
    by = {p.name: p for p in policies(1.0, 0.1, 16.0)}
    galaxy = run(by["galaxy"], jobs)
    knative = run(by["knative"], jobs)
    blind = run(dataclasses.replace(by["galaxy"], placement="least_loaded"), jobs)
    for o in (galaxy, knative, blind):
        assert o.done + o.refused == o.requests == len(jobs)
        assert len(o.ttfts) == o.done and 0 < o.good <= o.done
        assert o.cold_loads + o.warm_loads > 0 and o.gpu_s > 0
    # The same stack but placement: locality turns store loads into cache loads.
    assert galaxy.cold_loads < blind.cold_loads
    assert galaxy.warm_loads > blind.warm_loads
    assert galaxy.cold_loads < knative.cold_loads


@pytest.mark.slow
@needs_trace
def test_a_central_router_charges_every_pick() -> None:
    jobs = small()
    central = next(p for p in policies(1.0, 0.1, 16.0) if p.name == "llm-d")
    owner = dataclasses.replace(central, central=False)
    # 0.2 s per pick on one router is far beyond the arrival gap: picks queue.
    slow_central = run(central, jobs, decision_s=0.2)
    slow_owner = run(owner, jobs, decision_s=0.2)
    assert slow_central.ttft_pct(50) > slow_owner.ttft_pct(50) + 1.0


@pytest.mark.slow
@needs_trace
def test_same_seed_same_result() -> None:
    jobs = small()
    knative = next(p for p in policies(1.0, 0.1, 16.0) if p.name == "knative")
    a, b = run(knative, jobs), run(knative, jobs)
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    other = FleetSim(knative, FUNCTIONS, LARGE, SHAPE, seed=8).run(jobs)
    assert other.ttfts != a.ttfts  # the seed drives the random pick


def test_bad_arguments_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--nodes", "0"])
    err = capsys.readouterr().err
    assert "--nodes" in err and "Traceback" not in err
