"""Synthetic load generator output, turned into plan results by the real
summarizer, for report and recommend tests (no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.bench import plan as pl
from controlplane.bench import promscrape as ps
from controlplane.bench import runner, summary

BENCH = {
    "name": "fake",
    "objectives": ["p99_cold_start<50ms", "ratio_requests_per_s>0.1", "free-form goal"],
    "control_plane": {"nodes": 4},
    "scenarios": [
        {"name": "mix", "total_requests": 12, "warmup_requests": 2, "cold_fraction": 0.5}
    ],
}


def loadgen_result(cold_ms: float = 20.0) -> dict[str, Any]:
    lat = [1.0, 2.0, 1.5, cold_ms, cold_ms + 5, 1.2, 1.1, cold_ms + 1, 1.3]
    cold = [0, 0, 0, 1, 1, 0, 0, 1, 0]
    return {
        "target": "galaxy",
        "mode": "open",
        "concurrency": 4,
        "measured": 10,
        "ok": 9,
        "errors": {"DEADLINE_EXCEEDED": 1},
        "not_sent": 0,
        "duration_s": 0.5,
        "cpu_s": 0.1,
        "rpcs": 16,
        "t_ms": [i * 50.0 for i in range(9)],
        "lat_ms": lat,
        "cold": cold,
        "wait_ms": [v * 0.8 for v in lat],
        "lag_ms": [0.1] * 10,
        "release_errors": {},
        "prime_errors": {},
        "released_at_end": 3,
    }


def echo_result() -> dict[str, Any]:
    r = loadgen_result()
    r.update(target="echo", mode="closed", cold=[0] * 9, errors={}, measured=9, rpcs=9)
    r["duration_s"] = 0.01  # 900 req/s
    return r


def _scrape(n: float) -> ps.Scrape:
    return ps.parse(
        "# TYPE galaxy_scheduling_latency_seconds histogram\n"
        f'galaxy_scheduling_latency_seconds_bucket{{le="0.001"}} {n}\n'
        f'galaxy_scheduling_latency_seconds_bucket{{le="+Inf"}} {n}\n'
        f"galaxy_scheduling_latency_seconds_count {n}\n"
        f"galaxy_scheduling_latency_seconds_sum {n * 0.0005}\n"
    )


def plan_result(cold_ms: float = 20.0) -> dict[str, Any]:
    bf = pl.parse(BENCH, Path("fake.yaml"))
    plan = next(bf.experiment.plans())
    s = pl.load_settings(bf, plan)
    wl = pl.build_workload(bf, plan, s, "p0-0", Path("/nonexistent"))
    scr = {"s0": [_scrape(0)], "s1": [_scrape(3)], "d0": [_scrape(0)], "d1": [_scrape(0)]}
    cp = pl.control_plane_config(bf, plan.params)
    r = summary.summarize_plan(plan, cp, s, wl, loadgen_result(cold_ms), echo_result(), scr)
    r["cpu_cores"] = {"load_generator": 0.2, "dispatch-0": 0.5}
    r["baseline"]["echo"]["cpu_cores"] = {"load_generator": 0.3, "echo_server": 0.4}
    return r


def results(n_plans: int = 2) -> dict[str, Any]:
    return {
        "schema": runner.SCHEMA,
        "experiment": "fake",
        "file": "fake.yaml",
        "command": "galaxy bench -f fake.yaml",
        "started_at": "now",
        "finished_at": "later",
        "machine": runner.machine_info(),
        "objectives": BENCH["objectives"],
        "plans": [plan_result() for _ in range(n_plans)],
        "failures": [{"label": "x", "params": {}, "error": "boom"}],
    }
