"""Trace loaders on the real files, synthetic generators, experiment plans."""

import itertools

import pytest

from controlplane.bench import experiment as ex
from simulator import traces
from simulator import workload as wl


def _all(w: wl.Workload) -> tuple[list[float], list[int], list[float]]:
    t, f, d = [], [], []
    for bt, bf, bd in w.batches():
        t += list(bt)
        f += list(bf)
        d += list(bd)
    return t, f, d


def test_azure2019_sample_counts_spread_and_durations(shared_data):
    folder = shared_data / "azure-functions-2019" / "sample-500-8h"
    full = traces.azure2019(folder)
    assert len(full.functions) == 500 and full.expected_requests == 3_037_902
    w = traces.azure2019(folder, minutes=3, seed=2)
    t, f, d = _all(w)
    assert len(t) == w.expected_requests and t == sorted(t)
    assert 0 <= t[0] and t[-1] < 180.0
    assert max(f) < 500 and min(d) >= 0.0
    # Seeded: the same seed replays the same arrivals, another does not.
    assert _all(traces.azure2019(folder, minutes=3, seed=2))[0] == t
    assert _all(traces.azure2019(folder, minutes=3, seed=3))[0] != t
    even = _all(traces.azure2019(folder, minutes=1, spread="even"))[0]
    assert len(even) == len([x for x in t if x < 60.0])


def test_azure2021_per_invocation_rows(shared_data):
    w = traces.azure2021(shared_data / "azure-functions-2021" / "Azure2021_200.csv")
    t, _, _ = _all(w)
    assert len(t) == 199 and len(w.functions) == 31 and t == sorted(t)
    assert 0.0 < t[0] < 0.01 and 1199 < t[-1] < 1201


def test_llm2023_traces_and_cost_model(shared_data):
    w = traces.llm2023(shared_data / "azure-llm-inference-2023")
    t, f, d = _all(w)
    assert len(t) == 8_819 + 19_366 and t == sorted(t) and t[0] == 0.0
    assert {f.count(0), f.count(1)} == {8_819, 19_366}
    cost = traces.LlmCost(ttft_base_s=0.01, prefill_tps=1000.0, tpot_s=0.02)
    assert cost.seconds(1000, 10) == pytest.approx(0.01 + 1.0 + 0.2)
    assert min(d) > 0 and w.functions[0].gpus == 1


def test_missing_trace_names_the_file(tmp_path):
    with pytest.raises(traces.TraceError, match=r"invocations\.csv"):
        traces.azure2019(tmp_path)


def test_bursts_reach_200x_and_double_within_five_minutes():
    shape = wl.BurstShape()
    rates = [shape.rate(x) for x in range(0, 1200)]
    assert max(rates) / min(rates) >= 200
    # Doubling: from any point of the rise, twice the rate within 300 s.
    rise = [(i, r) for i, r in enumerate(rates) if shape.first_s <= i < shape.first_s + 200]
    for i, r in rise[:100]:
        assert any(r2 >= 2 * r for r2 in rates[i : i + 300])
    w = wl.bursty(300, n_functions=20, seed=4)
    t, f, _ = _all(w)
    assert t == sorted(t) and max(f) < 20
    assert _all(wl.bursty(300, n_functions=20, seed=4))[0] == t


def test_poisson_and_gamma_rates():
    t, _, _ = _all(wl.poisson(200.0, 100.0, seed=1))
    assert len(t) / 100.0 == pytest.approx(200, rel=0.05)
    g = _all(wl.gamma(100.0, 0.25, 100.0, seed=1))[0]
    gaps = [b - a for a, b in itertools.pairwise(g)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((x - mean) ** 2 for x in gaps) / len(gaps)) ** 0.5 / mean
    assert cv == pytest.approx(2.0, rel=0.15)


def test_experiment_plan_becomes_a_workload():
    doc = {
        "scenarios": [
            {
                "total_requests": 300,
                "warmup_requests": 30,
                "cold_fraction": 0.1,
                "functions": 5,
                "request_profile": {"distribution": "Poisson", "arrival_rate": 15},
            }
        ]
    }
    plan = next(ex.parse(doc).plans())
    w = wl.from_plan(plan, seed=1)
    t, f, _ = _all(w)
    assert len(t) == 300 and w.warmup_s == t[30]
    cold = [x for x in f if x >= 5]
    assert len(cold) == len(set(cold)) == len(w.functions) - 5
    assert 15 <= len(cold) <= 50
