"""Short work on a process that is already running (a capacity credit's
``take`` on Dispatch): what the host model adds to it, how both sides of
the fidelity check time it, and its measured cost distribution."""

import json
import statistics

import pytest

from simulator import calibration, fidelity
from simulator.calibrate_decisions import take_cost, take_from_buckets
from simulator.engine import Station
from simulator.host import Host

SLICE = 0.0015


def test_short_work_on_a_running_process_costs_its_work_alone():
    # A machine with room: no background, more cores than processes with work.
    host = Host(2, slice_s=SLICE, seed=1, wakeup_s=0.0005, handoffs=3, wake_cpu_s=0.0005)
    me = Station("me", host=host)
    end = me.finish(0.010, 0.001)  # it wakes a halted core and runs 1 ms
    assert end >= 0.010 + 0.001 + 0.0005
    # A 12 us take that continues it: no wake-up, no hand-offs, no slice.
    t = me.finish(end, 12e-6)
    assert t - end == pytest.approx(12e-6) and t - host.began == pytest.approx(12e-6)
    # The same work after it has slept 10 ms pays the wake-up again.
    later = me.finish(t + 0.010, 12e-6)
    assert later - (t + 0.010) >= 12e-6 + 0.0005


def test_a_slice_boundary_falls_in_short_work_as_often_as_measured():
    host = Host(1, slice_s=SLICE, seed=1)
    for i in range(3):
        Station(f"o{i}", host=host).free_at = 1e9  # others with work: k > cores
    me = Station("me", host=host)
    delays = [host.preemption(me, 0.0, 15e-6) for _ in range(100_000)]
    share = sum(1 for d in delays if d > 0) / len(delays)
    # calibrate_preempt: 0.2-3% of 15 us pieces stretched past 100 us
    # (2026-11-29); the model's 15 us / 1.5 ms = 1%.
    assert 0.002 <= share <= 0.03


def test_a_jobs_span_on_its_core_excludes_the_wait_for_the_core():
    host = Host(1, slice_s=SLICE, seed=2)
    hog = Station("hog", host=host)
    hog.finish(0.0, 0.010)  # holds the only core for 10 ms
    me = Station("me", host=host)
    end = me.finish(0.0, 12e-6)
    # It waited (for the hog's slice to end or for the hog), then ran 12 us.
    assert end > 12e-6
    assert end - host.began == pytest.approx(12e-6)


def test_credit_decisions_are_timed_as_dispatch_times_them(cal):
    res = fidelity.sim_phase(cal, 40, 300, seed=1, concurrency=8, credits=True)
    # Both kinds of decision are counted, and the credits' dominate (the
    # real mix at 210 nodes: 96-99.9% from credits).
    assert 0 < res["credit_placements"] <= res["placements"]
    assert res["credit_placements"] / res["placements"] > 0.5
    # A take's span is its own work: the median is the calibrated take
    # (12 us), not a wait behind the loop's other work (tens of us or more).
    take = cal.mean("dispatch.credit_take")
    assert res["scheduling_exact_ms"]["p50"] / 1000 < 2 * take


def test_a_measured_shape_is_sampled_in_place_of_the_gamma(tmp_path, cal):
    doc = cal.to_json()
    shape = [0.5] * 90 + [5.5] * 10  # mean 1: nine in ten at half the mean
    doc["ops"]["dispatch.credit_take"] = {"mean_s": 1e-5, "cv": 0.5, "shape": shape}
    c = calibration.parse(doc)
    import random

    draw = c.sampler("dispatch.credit_take", random.Random(1))
    xs = [draw() for _ in range(10_000)]
    assert statistics.mean(xs) == pytest.approx(1e-5, rel=0.05)
    assert sum(1 for x in xs if x > 2e-5) / len(xs) == pytest.approx(0.10, abs=0.02)
    # The shape survives a round trip and a scaling.
    again = calibration.parse(json.loads(json.dumps(c.scaled(2.0).to_json())))
    assert again.ops["dispatch.credit_take"].shape == tuple(sorted(shape))
    assert again.mean("dispatch.credit_take") == pytest.approx(2e-5)


@pytest.mark.parametrize("shape", [[], [0.0, 1.0], ["x"], [1.0] * 1001, "1,2"])
def test_a_bad_shape_is_refused_naming_the_op(cal, shape):
    doc = cal.to_json()
    doc["ops"]["dispatch.credit_take"]["shape"] = shape
    with pytest.raises(calibration.CalibrationError, match=r"ops\.dispatch\.credit_take\.shape"):
        calibration.parse(doc)


def test_the_take_is_read_from_the_real_dispatchs_histogram():
    # 1,000 decisions: 870 under 25 us, 950 under 50, 990 under 100.
    buckets = {"2.5e-05": 870.0, "5e-05": 950.0, "0.0001": 990.0, "0.00025": 1000.0,
               "inf": 1000.0}  # fmt: skip
    got = take_from_buckets(buckets)
    assert got is not None
    mean, shape = got
    points = [mean * x for x in shape]
    # Read back through the same buckets, the same shares.
    for bound, share in ((25e-6, 0.87), (50e-6, 0.95), (100e-6, 0.99)):
        assert sum(1 for p in points if p <= bound) / len(points) == pytest.approx(share, abs=0.01)
    assert take_from_buckets({"2.5e-05": 100.0, "inf": 100.0}) is None  # too few for a tail


def test_the_in_process_take_is_microseconds():
    # Pure Python over four credits: well under Schedule's placement over a
    # partition, far under a millisecond.
    assert 0 < take_cost(takes=2000) < 200e-6


def test_the_credit_calibration_holds_every_plans_functions(tmp_path):
    """Both credit plans deploy their own pools into one cluster: the
    controller's limit must hold them (514 refused the second one)."""
    from controlplane.bench import plan as pl
    from simulator.calibrate import bench_doc

    bf = pl.parse(bench_doc(210, quick=True, credits=True), tmp_path / "c.yaml")
    assert bf.control_plane["credits"]
    deployed = 0
    for plan in bf.experiment.plans():
        s = pl.load_settings(bf, plan)
        deployed += len(pl.build_workload(bf, plan, s, "p", tmp_path).functions)
    assert bf.control_plane["max_functions"] >= deployed > 514
    assert [p.scenario.name for p in bf.experiment.plans()] == ["cold", "half"]


def test_a_failed_calibration_is_one_clear_line(monkeypatch, tmp_path, capsys):
    import asyncio

    from simulator import calibrate
    from simulator.cliconfig import FidelityConfig

    async def failing(*a, **k):
        raise RuntimeError("calibration run with credits failed: functions: limit")

    monkeypatch.setattr(calibrate, "measure", failing)
    args = FidelityConfig(out=str(tmp_path), calibration="measure")
    assert asyncio.run(fidelity.main(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1] == (
        "galaxy simulate-fidelity: calibrating failed: calibration run with credits failed: "
        "functions: limit"
    )
