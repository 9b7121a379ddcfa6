"""The recommendation search, with the bench runs faked."""

from pathlib import Path

import pytest

from controlplane.bench import recommend, runner, slo
from tests.bench import fakes


def test_candidates_are_cheapest_first():
    cs = recommend.candidates(2)
    assert len(cs) == 8 and all(c.caches for c in cs)
    assert [c.cost for c in cs] == sorted(c.cost for c in cs)
    assert cs[0].label == "dispatch=1 schedule=1 clustermgr=1 caches=on"
    # At equal cost, ClusterMgr (off the request path) is grown last.
    assert [c.clustermgr for c in cs if c.cost == 4] == [1, 1, 2]


def test_judge_needs_objectives_load_and_few_errors():
    objs = slo.parse("p99_cold_start<50ms")
    ok, why = recommend.judge(fakes.plan_result(cold_ms=20), objs, load=18.0)
    assert not ok and any("failed" in w for w in why)  # 1 error in 10 is too many
    p = fakes.plan_result(cold_ms=20)
    p["requests"]["errors"] = 0
    assert recommend.judge(p, objs, load=18.0) == (True, [])
    ok, why = recommend.judge(p, objs, load=100.0)
    assert not ok and "carried" in why[0]
    ok, why = recommend.judge(fakes.plan_result(cold_ms=80), objs, load=18.0)
    assert any("p99_cold_start<50ms: measured" in w for w in why)


@pytest.mark.slow
async def test_search_stops_at_the_first_passing_cost(monkeypatch, tmp_path):
    seen = []

    async def fake_run(bf, opts):
        params = {k: v[0] for k, v in bf.experiment.parameters.items()}
        seen.append(params)
        # Passes once Schedule has 2 instances; caches off never passes.
        good = params["schedule"] >= 2 and params["caches"]
        p = fakes.plan_result(cold_ms=20 if good else 90)
        p["requests"]["errors"] = 0
        return {**fakes.results(0), "plans": [p], "failures": []}

    monkeypatch.setattr(runner, "run_bench", fake_run)
    opts = runner.RunOptions(out=tmp_path, data_dir=Path("/x"), log=lambda s: None)
    doc = await recommend.recommend(None, slo.parse("p99_cold_start<50ms"), 18.0, opts)
    best = doc["recommendation"]
    assert best["candidate"] == "dispatch=1 schedule=2 clustermgr=1 caches=on"
    assert best["cost"] == 4
    # cost 3, then cost-4 candidates until one passes, then its caches-off twin.
    assert [(s["dispatch"], s["schedule"], s["caches"]) for s in seen] == [
        (1, 1, True),
        (2, 1, True),
        (1, 2, True),
        (1, 2, False),
    ]
    text = recommend.render(doc)
    assert "Cheapest passing: dispatch=1 schedule=2" in text
    assert (tmp_path / "trials" / "00" / "report.md").exists()


def test_workload_from_a_file_is_open_loop_at_the_load():
    from controlplane.bench import plan as pl

    bf = pl.load_file(Path(__file__).resolve().parents[2] / "experiments" / "cold-burst.yaml")
    w = recommend.workload(bf, slo.parse("p99_cold_start<50ms"), 300.0, 2.0)
    (sc,) = w.experiment.scenarios
    assert sc.profile.arrival_rate == 300.0 and sc.extra["mode"] == "open"
    assert "rate_of" not in sc.extra and w.experiment.parameters == {}
    w = recommend.workload(None, slo.parse("p99_dispatch<5ms"), 300.0, 2.0)
    assert w.experiment.scenarios[0].cold_fraction == 0.0
    assert w.experiment.scenarios[0].total_requests == 600 + 60
