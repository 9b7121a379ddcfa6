"""Scale-ups still waiting at the end of a run are counted, not dropped:
every system's scheduling tail is reported with them as censored samples."""

from __future__ import annotations

from simulator import workload as wl
from simulator.metrics import Recorder, unsettled
from simulator.runner import run_one
from simulator.system import SimConfig

SMALL = {"cpu_millis": 10, "memory_mib": 16, "cold_start_s": 0.0}


def test_unsettled_is_the_multiset_difference_of_ask_times() -> None:
    asked = [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]
    settled = [1.0, 3.0, 1.0]  # any order; one of the 1.0s and 2.0, 3.0 remain
    assert sorted(unsettled(asked, settled, end=10.0)) == [7.0, 8.0, 9.0]
    assert unsettled(asked, asked, end=10.0) == []


def test_recorder_counts_placed_given_up_and_waiting() -> None:
    r = Recorder(duration_s=10.0, warmup_s=1.0)
    r.asked(0.5)  # before warmup: not counted in the tail
    r.asked(2.0, 3)
    r.scheduled(2.0, 2.5)
    r.gave_up(2.0)
    s = r.summary(10.0)
    assert s["counts"]["scale_ups"] == 4
    assert s["scale_ups_unplaced_at_end"] == 1
    assert s["scheduling_latency_with_unplaced_s"]["max"] == 8.0
    assert s["scheduling_latency_s"]["max"] == 0.5


def test_a_queue_left_at_the_end_shows_in_the_tail(cal) -> None:
    # Knative's serial chain (2.5 pods/s) cannot finish 200 cold starts in
    # the 10 s run: most are still queued when it ends.
    w = wl.flood(200, 1e6, 200, 10.0, seed=1, **SMALL)
    r = run_one("knative", w, SimConfig(nodes=20), cal)
    n = r["counts"]
    waiting = r["scale_ups_unplaced_at_end"]
    assert waiting > 0
    assert waiting + n["placements"] + n.get("unschedulable", 0) == n["scale_ups"]
    assert r["scheduling_latency_with_unplaced_s"]["p99"] > r["scheduling_latency_s"]["p99"]
    # Galaxy finishes the same flood: nothing left, the two tails agree.
    g = run_one("galaxy", w, SimConfig(nodes=20), cal)
    assert g["scale_ups_unplaced_at_end"] == 0
    assert g["scheduling_latency_with_unplaced_s"] == g["scheduling_latency_s"]
