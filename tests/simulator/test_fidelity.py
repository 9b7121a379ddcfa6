"""The simulated side of the fidelity check and its comparison."""

from typing import Any

import pytest

from simulator import calibration, fidelity


def test_simulated_phases_run_and_report_bucketed_quantiles(cal):
    closed = fidelity.sim_phase(cal, 40, 300, seed=1, concurrency=8)
    assert closed["instances_per_s"] > 0
    s = closed["scheduling_ms"]
    assert 270 <= s["count"] <= 280 and 0 < s["p50"] <= s["p99"]  # after the warmup
    rate = closed["instances_per_s"] / 2
    opened = fidelity.sim_phase(cal, 40, 300, seed=1, rate=rate)
    # Half the load is carried at the offered rate (Poisson arrivals: within
    # 5%). (Its p99 is not compared with the closed loop's: at 40 nodes
    # neither queues, and the two tails, ~0.2 ms, differ by which
    # heartbeat ModNodes calls fall in them.)
    assert opened["instances_per_s"] == pytest.approx(rate, rel=0.05)
    assert 0 < opened["scheduling_ms"]["p50"] <= opened["scheduling_ms"]["p99"]


def test_compare_passes_within_25_percent_only():
    real = {
        "max": {"instances_per_s": 100.0, "scheduling_ms": {"p50": 1.0, "p99": 8.0}},
        "half": {"scheduling_ms": {"p50": 1.0, "p99": 10.0}},
    }
    sim: dict[str, dict[str, Any]] = {
        "max": {"instances_per_s": 120.0, "scheduling_ms": {"p50": 1.1, "p99": 6.4}},
        "half": {"scheduling_ms": {"p50": 0.8, "p99": 12.4}},
    }
    rows, ok = fidelity.compare(sim, real)
    assert ok and [r[3] for r in rows] == ["1.20", "0.80", "1.24", "1.10", "0.80"]
    sim["half"]["scheduling_ms"]["p99"] = 13.0
    assert not fidelity.compare(sim, real)[1]


def test_bench_doc_is_a_valid_bench_file(tmp_path):
    from controlplane.bench import plan as pl

    bf = pl.parse(fidelity.bench_doc(210, quick=True), tmp_path / "f.yaml")
    assert [p.scenario.name for p in bf.experiment.plans()] == ["max", "half"]


def test_other_work_on_the_machine_slows_the_simulated_cluster(cal):
    quiet = fidelity.sim_phase(cal, 40, 300, seed=1, concurrency=8)
    busy = fidelity.sim_phase(cal, 40, 300, seed=1, concurrency=8, background=1.0)
    # Half the machine's two cores taken: the CPU-bound closed loop slows.
    assert busy["instances_per_s"] < 0.8 * quiet["instances_per_s"]
    assert set(busy["cpu_cores"]) >= {"dispatch-0", "schedule-0", "agent-0"}


def test_background_processes_from_what_the_real_phase_measured():
    def phase(others, ours, runnable):
        return {"machine_cores": {"others": others, "ours": ours, "ours_runnable": runnable}}

    # Room to spare: the others took all they wanted (0.7 cores: 0.7 of a hog).
    assert fidelity.background_processes(phase(0.7, 0.8, 1.5), 2) == 0.7
    # A full machine: they got their fair share, 2k/(k + 6) = 0.25 -> k = 6/7.
    assert abs(fidelity.background_processes(phase(0.25, 1.75, 6.0), 2) - 6 / 7) < 1e-9
    assert fidelity.background_processes({}, 2) == 0.0  # an old result without readings


async def test_a_reused_real_result_brings_its_calibration(tmp_path, cal):
    import argparse
    import json

    doc = {"real": {}, "calibration": cal.to_json()}
    doc["calibration"]["ops"]["schedule.decide"]["mean_s"] = 0.000123
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(doc))
    args = argparse.Namespace(calibration="measure", real=str(path), nodes=210, quick=True)
    used = await fidelity._calibration(args, print)
    assert used.ops["schedule.decide"].mean_s == 0.000123
    args.calibration = "shipped"
    assert (await fidelity._calibration(args, print)).ops == cal.ops


def test_repeated_runs_are_judged_by_the_median_ratio():
    def run(tput, p50, p99, busy_p99=None):
        busy = {"p50": p50, "p99": p99 if busy_p99 is None else busy_p99}
        return {
            "max": {"instances_per_s": tput, "scheduling_ms": busy},
            "half": {"scheduling_ms": {"p50": p50, "p99": p99}},
        }

    real = run(100.0, 1.0, 10.0)
    # One run's tail far off (a noisy neighbour), the other two close.
    sims = [run(110.0, 1.1, 30.0), run(90.0, 0.9, 11.0), run(100.0, 1.0, 9.0)]
    rows, ok = fidelity.compare_runs([(s, real) for s in sims])
    assert ok
    assert rows[2][3] == "3.00 1.10 0.90" and rows[2][4] == "1.10"
    rows, ok = fidelity.compare_runs([(sims[0], real), (sims[0], real), (sims[1], real)])
    assert not ok and rows[2][5] == "FAIL"
    # Latency is judged at both loads: a tail off at the maximum rate alone fails.
    names = [r[0] for r in rows]
    assert names[1:] == [
        f"{ph}: scheduling {q} (ms)" for ph in ("half", "max") for q in ("p50", "p99")
    ]
    rows, ok = fidelity.compare_runs([(run(100.0, 1.0, 10.0, busy_p99=5.0), real)] * 3)
    assert not ok and [r[0] for r in rows if r[5] == "FAIL"] == ["max: scheduling p99 (ms)"]


def test_each_phase_is_simulated_with_the_take_measured_at_its_load(cal):
    from simulator.calibrate_decisions import TAKE_AT_MAX, at_load, take_ops

    # Cumulative bucket counts as Dispatch's histogram gives them: 1,000
    # decisions, the busy ones with the longer tail.
    half = {"1e-05": 500.0, "2e-05": 980.0, "0.0001": 1000.0, "+Inf": 1000.0}
    busy = {"1e-05": 500.0, "2e-05": 900.0, "0.0001": 1000.0, "+Inf": 1000.0}
    ops = take_ops("test", half, busy, cv=0.5)
    assert set(ops) == {"dispatch.credit_take", TAKE_AT_MAX}
    assert ops[TAKE_AT_MAX].mean_s > ops["dispatch.credit_take"].mean_s
    both = calibration.Calibration({**cal.ops, **ops}, cal.params, cal.meta, cal.sources)
    assert at_load(both, "max").ops["dispatch.credit_take"] == ops[TAKE_AT_MAX]
    assert at_load(both, "half").ops["dispatch.credit_take"] == ops["dispatch.credit_take"]
    # A calibration without the busy take (the shipped one) uses one take at both.
    assert at_load(cal, "max") is cal
    # Too few decisions at a load to give a tail: that take is left out.
    assert set(take_ops("test", half, {"+Inf": 10.0}, cv=0.5)) == {"dispatch.credit_take"}


def test_the_load_generator_cost_is_measured_per_real_phase():
    phase = {"cpu_cores": {"load_generator": 0.3}, "instances_per_s": 400.0}
    assert fidelity.client_cost(phase) == pytest.approx(0.00075)
    assert fidelity.client_cost({"cpu_cores": {}, "instances_per_s": 400.0}) is None
    assert fidelity.client_cost({"cpu_cores": {"load_generator": 0.3}}) is None


def test_each_real_run_is_simulated_with_several_seeds_and_their_medians_compared():
    def phase(tput, p50, p99):
        return {"instances_per_s": tput, "scheduling_ms": {"p50": p50, "p99": p99}, "x": 1}

    med = fidelity._median_of([phase(100, 1.0, 9.0), phase(90, 3.0, 2.0), phase(120, 2.0, 30.0)])
    assert med["instances_per_s"] == 100 and med["scheduling_ms"] == {"p50": 2.0, "p99": 9.0}
    assert len(med["seeds"]) == 3 and med["x"] == 1


def test_simulate_run_uses_the_real_runs_rate_and_sim_seeds(cal, monkeypatch):
    seen = []

    def fake_phase(cal, nodes, total, seed, **kw):
        seen.append((seed, kw.get("rate"), kw.get("concurrency")))
        return {"instances_per_s": float(seed), "scheduling_ms": {"p50": 1.0, "p99": 2.0}}

    monkeypatch.setattr(fidelity, "sim_phase", fake_phase)
    real = {"max": {}, "half": {"arrival_rate": 123.0}}
    out = fidelity.simulate_run(cal, real, 40, True, seed=5)
    seeds = list(range(5, 5 + fidelity.SIM_SEEDS))
    assert seen == [(s, None, 32) for s in seeds] + [(s, 123.0, None) for s in seeds]
    assert out["max"]["instances_per_s"] == float(seeds[len(seeds) // 2])


def test_diagnostics_show_probe_round_trips_and_skip_missing_readings():
    def run(rt50, ppp):
        half = {"probe_round_ms": {"p50": rt50, "p99": 2 * rt50}, "probes_per_placement": ppp}
        return {"half": half, "max": {"probes_per_placement": ppp}}

    old_real = {"half": {"probes_per_placement": 0.1}, "max": {}}  # before the metric existed
    rows = fidelity.diagnostics([(run(1.0, 0.1), run(3.0, 0.05)), (run(2.0, 0.2), old_real)])
    assert rows[0] == ["half: probe round trip p50 (ms)", "1.500", "3.000"]
    assert rows[2] == ["half: probes per placement", "0.150", "0.075"]
    assert rows[3][2] == "0.050"


def test_runs_with_a_core_of_other_work_are_flagged():
    sims = [{"background": {"max": 0.2, "half": 0.3}}, {"background": {"max": 3.4, "half": 0.2}}]
    assert fidelity.busy_runs(sims) == [2]
    assert fidelity.busy_runs(sims[:1]) == []


def test_op_costs_are_scaled_per_process_to_the_real_runs_cpu(cal):
    sim = {"cpu_cores": {"dispatch-0": 0.2, "schedule-0": 0.4, "agent-0": 0.1, "agent-1": 0.1}}
    real = {"cpu_cores": {"dispatch-0": 0.3, "schedule-0": 0.2, "agent-0": 0.25, "agent-1": 0.15,
                          "load_generator": 0.5}}  # fmt: skip
    f = fidelity.speed_factors(sim, real)
    assert f == pytest.approx({"dispatch": 1.5, "schedule": 0.5, "agent": 2.0, "clustermgr": 1.0})
    s = cal.scaled(f)
    assert s.mean("dispatch.scale_up") == pytest.approx(1.5 * cal.mean("dispatch.scale_up"))
    assert s.mean("agent.probe") == pytest.approx(2.0 * cal.mean("agent.probe"))
    assert s.mean("clustermgr.update") == cal.mean("clustermgr.update")
    assert s.mean("client.rpc") == cal.mean("client.rpc")  # the harness: not a process checked
    assert s.params == cal.params and cal.mean("dispatch.scale_up") != s.mean("dispatch.scale_up")


def test_simulate_run_scales_costs_from_a_first_half_phase(cal, monkeypatch):
    seen = []

    def fake_phase(cal_, nodes, total, seed, **kw):
        seen.append(cal_.mean("schedule.schedule"))
        return {"instances_per_s": 1.0, "scheduling_ms": {"p50": 1.0, "p99": 2.0},
                "cpu_cores": {"schedule-0": 0.1}}  # fmt: skip

    monkeypatch.setattr(fidelity, "sim_phase", fake_phase)
    real = {"max": {}, "half": {"arrival_rate": 10.0, "cpu_cores": {"schedule-0": 0.3}}}
    out = fidelity.simulate_run(cal, real, 40, True, seed=1)
    assert out["factors"]["schedule"] == pytest.approx(3.0)
    base = cal.mean("schedule.schedule")
    assert seen[0] == base and all(v == pytest.approx(3 * base) for v in seen[1:])
    assert len(seen) == 1 + 2 * fidelity.SIM_SEEDS
