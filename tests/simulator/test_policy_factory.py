"""The simulator builds Schedule's policy objects with the production
factory (``functions.schedule.factory``): a registered scoring term and the
ledger's per-holder limit reach the simulated Schedule instances exactly as
they reach the servicer."""

from collections.abc import Iterator
from dataclasses import replace

import pytest

from controlplane.runtime.resources import Res
from functions.schedule import scoring
from functions.schedule.config import ScheduleConfig
from functions.schedule.main import from_config
from functions.schedule.model import NodeInfo, least_loaded
from simulator import workload as wl
from simulator.galaxy.model import VARIANTS, GalaxyModel
from simulator.runner import run_one
from simulator.system import Env, SimConfig

TERM = "test_counting_least_loaded"


@pytest.fixture
def counted() -> Iterator[list[str]]:
    """A scoring term that scores as least_loaded and records each call."""
    calls: list[str] = []

    def term(node: NodeInfo, free: Res, need: Res, function: str = "") -> float:
        calls.append(node.node_id)
        return least_loaded(node, free, need, function)

    scoring.register(TERM)(term)
    try:
        yield calls
    finally:
        del scoring.SCORES[TERM]


def test_a_registered_scoring_term_takes_effect_in_the_simulator(counted, cal):
    w = wl.poisson(100.0, 10.0, n_functions=8, mean_duration_s=0.5, seed=2)
    cfg = SimConfig(nodes=40, seed=2, params={"Gn-CPE": {"scoring": TERM}})
    r = run_one("Gn-CPE", w, cfg, cal)
    assert r["params"]["scoring"] == TERM
    # Every placement scores its candidates with the configured term.
    assert r["counts"]["placements"] > 0
    assert len(counted) >= r["counts"]["placements"]


def test_production_and_simulator_build_the_same_policy(counted, cal):
    prod = from_config(ScheduleConfig(scoring=TERM, credits_per_holder=2))
    g = VARIANTS["galaxy"]
    w = wl.poisson(10.0, 1.0, n_functions=2, mean_duration_s=0.5, seed=1)
    sim_cfg = replace(g, scoring=TERM, credits_per_holder=2, credit_target=5)
    model = GalaxyModel(Env(SimConfig(nodes=4), cal, w, 1), sim_cfg)
    sfs = list(model.control.sfs.values())
    assert sfs
    for sf in sfs:
        assert sf.policy.score is prod.policy.score
        assert sf.ledger is not None and prod.servicer.credits is not None
        # The ledger's limit is Schedule's credits_per_holder, not
        # Dispatch's credit_target (a wallet's refill goal).
        assert sf.ledger.max_per_holder == prod.servicer.credits.max_per_holder == 2
