"""Sensitivity of the comparison to the baselines' assumed constants:

    galaxy simulate --experiment sensitivity --out results/sim-sensitivity

Every constant of a baseline model that is assumed (no published per-op
figure) or fitted is run at x0.5 and x2 on the overall experiment's bursty
load; each row says whether Galaxy still has the lower p99 scheduling latency
(counting the scale-ups left unplaced at the end as censored samples) and
the higher saturated scale-up rate. An ordering that holds only at one value
of an assumed constant is not a result.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator.baselines.atoll import AtollConfig
from simulator.baselines.knative import KnativeConfig
from simulator.baselines.ray import RayConfig
from simulator.baselines.sparrow import SparrowConfig
from simulator.calibration import Calibration
from simulator.studies import FLOOD_FUNCTIONS, SMALL, Log, Section, _ms, _run
from simulator.system import SimConfig
from simulator.workload import BurstShape, bursty, flood

#: The models' parameters, whose defaults the sweep scales.
CONFIGS: dict[str, type] = {
    "knative": KnativeConfig,
    "sparrow": SparrowConfig,
    "ray": RayConfig,
    "atoll": AtollConfig,
}
#: (system, parameter, why it is in the sweep)
ASSUMED: list[tuple[str, str, str]] = [
    ("knative", "serving_s", "fitted to ~2.5 pod starts/s"),
    ("knative", "controller_s", "assumed"),
    ("knative", "write_s", "assumed"),
    ("knative", "scheduler_pods_per_s", "cited: kube-scheduler's ~100 pods/s, workload-dependent"),
    ("sparrow", "schedulers", "assumed: the number of schedulers"),
    ("ray", "controller_op_s", "assumed: no published per-op figure"),
    ("ray", "frontends", "assumed"),
    ("ray", "controller_loop_s", "Ray Serve's control loop period, counted as scheduling wait"),
    ("ray", "view_refresh_s", "Ray's resource broadcast period (a default, tunable)"),
    ("atoll", "scale_delay_s", "assumed"),
    ("atoll", "sgs", "assumed: the number of SGSs"),
    ("atoll", "backlog_s", "assumed: the home SGS queueing that adds an SGS"),
]
FACTORS = (0.5, 2.0)


def _scaled(default: float, factor: float) -> float | int:
    v = default * factor
    return max(1, round(v)) if isinstance(default, int) else v


def _p99(r: dict[str, Any]) -> float:
    s = r.get("scheduling_latency_with_unplaced_s") or r["scheduling_latency_s"]
    return float(s["p99"])


def sensitivity(
    cal: Calibration, seed: int, quick: bool, log: Log, progress: bool
) -> list[Section]:
    """The sweep (``--quick``: shorter loads, same constants)."""
    cfg = SimConfig(nodes=210, seed=seed)
    dur = 120.0 if quick else 300.0
    shape = BurstShape(trough_rps=10, peak_ratio=256, double_s=30, hold_s=60, fall_s=60,
                       period_s=300, first_s=30)  # fmt: skip
    w = bursty(dur, shape, n_functions=200, seed=seed, cpu_millis=100, memory_mib=128)
    fw = flood(1000 if quick else 4000, 20000.0, FLOOD_FUNCTIONS, 30.0, seed=seed, **SMALL)
    g_burst = _run("bursty galaxy", "galaxy", w, cfg, cal, log, progress)
    g_flood = _run("flood galaxy", "galaxy", fw, cfg, cal, log, progress)
    g99, grate = _p99(g_burst), g_flood["throughput"]["scale_up_rate_99_per_s"]
    sec = Section(
        f"Assumed constants x0.5 and x2 (bursty {dur:.0f} s and a flood, 210 nodes); "
        f"Galaxy: sched p99 {_ms(g99)} ms, {grate:.0f} scale-ups/s",
        ["system", "constant", "why", "x", "value", "sched p99 ms (with unplaced)",
         "unplaced at end", "scale-ups/s", "galaxy p99 lower", "galaxy faster", "ordering"],
    )  # fmt: skip
    sec.runs["galaxy bursty"], sec.runs["galaxy flood"] = g_burst, g_flood
    held = 0
    for system, param, why in ASSUMED:
        default = getattr(CONFIGS[system](), param)
        for factor in FACTORS:
            value = _scaled(default, factor)
            c = replace(cfg, params={system: {param: value}})
            label = f"{system} {param}={value}"
            b = _run(f"bursty {label}", system, w, c, cal, log, progress)
            f = _run(f"flood {label}", system, fw, c, cal, log, progress)
            b99, rate = _p99(b), f["throughput"]["scale_up_rate_99_per_s"]
            lower, faster = g99 < b99, grate > rate
            held += lower and faster
            sec.runs[f"{label} bursty"], sec.runs[f"{label} flood"] = b, f
            sec.rows.append([system, param, why, f"x{factor:g}", str(value), _ms(b99),
                             str(b["scale_ups_unplaced_at_end"]), f"{rate:.0f}",
                             "yes" if lower else "NO", "yes" if faster else "NO",
                             "holds" if lower and faster else "CHANGES"])  # fmt: skip
    total = len(ASSUMED) * len(FACTORS)
    sec.note = f"The ordering holds in {held} of {total} runs."
    return [sec]
