"""Experiment files, arrivals and summaries."""

import itertools
import math
import statistics

import pytest

from controlplane.bench import experiment as ex

DOC = {
    "scenarios": [
        {
            "total_requests": 300,
            "warmup_requests": 30,
            "request_profile": {"distribution": "Poisson", "arrival_rate": 15},
        },
    ],
    "parameters": [
        {"name": "schedule_instances", "value": [1, 2, 4]},
        {"name": "probe_cache", "value": [True, False]},
    ],
}


def test_design_md_example_parses_into_plans():
    e = ex.parse(DOC)
    plans = list(e.plans())
    assert len(plans) == 6
    assert plans[0].params == {"schedule_instances": 1, "probe_cache": True}
    assert plans[0].scenario.profile.distribution == "poisson"
    assert "schedule_instances=1" in plans[0].label


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"total_requests": 0}, "scenarios[0].total_requests"),
        ({"warmup_requests": 300}, "scenarios[0].warmup_requests"),
        (
            {"request_profile": {"distribution": "zipf"}},
            "scenarios[0].request_profile.distribution",
        ),
        ({"request_profile": {"arrival_rate": -1}}, "scenarios[0].request_profile.arrival_rate"),
        ({"cold_fraction": 2}, "scenarios[0].cold_fraction"),
    ],
)
def test_errors_name_the_field(patch, field):
    doc = {"scenarios": [{**DOC["scenarios"][0], **patch}]}
    with pytest.raises(ex.ExperimentError) as e:
        ex.parse(doc)
    assert str(e.value).startswith(field)


def test_poisson_arrivals_have_the_requested_rate_and_are_seeded():
    p = ex.RequestProfile("poisson", 100.0)
    a = p.arrivals(20_000, seed=1)
    assert a == p.arrivals(20_000, seed=1) and a != p.arrivals(20_000, seed=2)
    assert a == sorted(a)
    rate = len(a) / a[-1]
    assert 95 < rate < 105


def _cv_of_gaps(shape: float) -> float:
    a = ex.RequestProfile("gamma", 50.0, shape=shape).arrivals(20_000, seed=3)
    gaps = [b - x for x, b in itertools.pairwise(a)]
    return statistics.stdev(gaps) / statistics.fmean(gaps)


def test_gamma_shape_controls_burstiness():
    assert _cv_of_gaps(0.25) == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(k)
    assert _cv_of_gaps(4.0) == pytest.approx(0.5, rel=0.1)


def test_summary_percentiles():
    s = ex.summarize(list(range(1, 101)))
    assert s["count"] == 100 and s["mean"] == 50.5
    assert s["p50"] == pytest.approx(50.5) and s["p99"] == pytest.approx(99.01)
    assert math.isnan(ex.summarize([])["p50"])
