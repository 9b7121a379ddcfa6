"""The simulated side of the fidelity check and its comparison."""

from simulator import fidelity


def test_simulated_phases_run_and_report_bucketed_quantiles(cal):
    closed = fidelity.sim_phase(cal, 40, 300, seed=1, concurrency=8)
    assert closed["instances_per_s"] > 0
    s = closed["scheduling_ms"]
    assert 270 <= s["count"] <= 280 and 0 < s["p50"] <= s["p99"]  # after the warmup
    opened = fidelity.sim_phase(cal, 40, 300, seed=1, rate=closed["instances_per_s"] / 2)
    assert opened["scheduling_ms"]["p99"] <= s["p99"]  # half the load, no more queueing


def test_compare_passes_within_25_percent_only():
    real = {
        "max": {"instances_per_s": 100.0},
        "half": {"scheduling_ms": {"p50": 1.0, "p99": 10.0}},
    }
    sim = {
        "max": {"instances_per_s": 120.0},
        "half": {"scheduling_ms": {"p50": 0.8, "p99": 12.4}},
    }
    rows, ok = fidelity.compare(sim, real)
    assert ok and [r[3] for r in rows] == ["1.20", "0.80", "1.24"]
    sim["half"]["scheduling_ms"]["p99"] = 13.0
    assert not fidelity.compare(sim, real)[1]


def test_bench_doc_is_a_valid_bench_file(tmp_path):
    from controlplane.bench import plan as pl

    bf = pl.parse(fidelity.bench_doc(210, quick=True), tmp_path / "f.yaml")
    assert [p.scenario.name for p in bf.experiment.plans()] == ["max", "half"]
