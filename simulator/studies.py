"""The four experiments of docs/simulator.md, one command each:

    galaxy simulate --experiment overall      --out results/sim-overall
    galaxy simulate --experiment scalability  --out results/sim-scalability
    galaxy simulate --experiment ablation     --out results/sim-ablation
    galaxy simulate --experiment cluster-size --out results/sim-cluster-size

Each is bounded (minutes on a laptop core) and seeded. ``--quick`` shrinks
each one for CI. Every study returns its sections: (title, table header,
rows, per-run results) that the CLI writes as report.md/results.json.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from simulator.baselines.atoll import AtollConfig
from simulator.baselines.sparrow import SparrowConfig
from simulator.calibration import Calibration
from simulator.runner import run_one, with_params
from simulator.system import SimConfig
from simulator.workload import BurstShape, Workload, bursty, flood

BASELINES = ["galaxy", "knative", "sparrow", "ray", "atoll"]
FIXED = "galaxy n=4 fixed"
#: small functions so capacity is not what limits a flood (the bench uses
#: the same 10m / 16 MiB)
SMALL = {"cpu_millis": 10, "memory_mib": 16, "cold_start_s": 0.0}
#: functions a flood spreads over (the bench's cold pool is 256 too)
FLOOD_FUNCTIONS = 256
#: warm standbys per kind in the cluster-size experiment's standby rows
STANDBY = 4
#: the cluster size sweep lets the controller grow each kind to 64 instances
#: (at 10,000 nodes it needs 56-64), above production's default limit of 8
#: (``controller.scaling.DEFAULT_MAX_INSTANCES``); production accepts the
#: same with ``galaxy serve controller --max-instances KIND=64``
SWEEP_MAX_INSTANCES = 64
Log = Callable[[str], None]


@dataclass
class Section:
    """One table of a study and the full results behind it."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str = ""


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def _run(label: str, system: str, w: Workload, cfg: SimConfig, cal: Calibration, log: Log,
         progress: bool) -> dict[str, Any]:  # fmt: skip
    r = run_one(system, w, cfg, cal, progress=progress)
    p = r["perf"]
    log(f"  {label}: {p['events']:,} events in {p['wall_s']:.1f}s ({p['events_per_s']:,.0f}/s)")
    return r


def overall(cal: Calibration, seed: int, quick: bool, log: Log, progress: bool) -> list[Section]:
    """Experiment 1: 210 nodes, bursty load, Galaxy vs each baseline; plus
    a flood of cold starts for saturation throughput."""
    cfg = SimConfig(nodes=210, seed=seed)
    dur = 300.0 if quick else 900.0
    shape = BurstShape(trough_rps=10, peak_ratio=256, double_s=30, hold_s=60, fall_s=60,
                       period_s=300, first_s=30)  # fmt: skip
    w = bursty(dur, shape, n_functions=200, seed=seed, cpu_millis=100, memory_mib=128)
    a = Section(
        f"Bursty load ({w.notes[0]}), {dur:.0f} s, 210 nodes",
        ["system", "sched p50 ms", "sched p99 ms", "unplaced at end",
         "sched p99 incl. unplaced (a lower bound) ms", "dispatch p99 ms", "cold p99 ms",
         "req/s", "instances started", "galaxy p99 lower by"],
    )  # fmt: skip
    for s in BASELINES:
        a.runs[s] = _run(f"bursty {s}", s, w, cfg, cal, log, progress)
    # Galaxy without the controller (n = 4 fixed), to tell the controller's
    # part from the rest.
    fixed = replace(cfg, params={"galaxy": {"controller_scaling": False}})
    a.runs[FIXED] = _run(f"bursty {FIXED}", "galaxy", w, fixed, cal, log, progress)
    n = 2000 if quick else 8000
    fw = flood(n, 20000.0, FLOOD_FUNCTIONS, 30.0 if quick else 60.0, seed=seed, **SMALL)
    b = Section(
        f"Saturation: {fw.notes[0]}, 210 nodes",
        ["system", "instances started", "scale-ups/s", "sched p50 ms", "sched p99 ms",
         "cold p99 ms", "throughput vs galaxy", "platform CPU ms per start"],
    )  # fmt: skip
    for s in BASELINES:
        b.runs[s] = _run(f"flood {s}", s, fw, cfg, cal, log, progress)
    b.runs[FIXED] = _run(f"flood {FIXED}", "galaxy", fw, fixed, cal, log, progress)
    g = a.runs["galaxy"]["scheduling_latency_s"]["p99"]
    for s, r in a.runs.items():
        sl, tp = r["scheduling_latency_s"], r["throughput"]
        lower = 1 - g / sl["p99"] if sl["p99"] > 0 else 0.0
        a.rows.append([s, _ms(sl["p50"]), _ms(sl["p99"]), str(r["scale_ups_unplaced_at_end"]),
                       _ms(r["scheduling_latency_with_unplaced_s"]["p99"]),
                       _ms(r["dispatch_latency_s"]["p99"]),
                       _ms(r["cold_start_latency_s"]["p99"]), f"{tp['requests_per_s']:.1f}",
                       str(r["counts"].get("instances_started", 0)),
                       "-" if s.startswith("galaxy") else f"{lower:.1%}"])  # fmt: skip
    gt = b.runs["galaxy"]["throughput"]["scale_up_rate_99_per_s"]
    for s, r in b.runs.items():
        sl, tp = r["scheduling_latency_s"], r["throughput"]
        x = gt / tp["scale_up_rate_99_per_s"] if tp["scale_up_rate_99_per_s"] else float("inf")
        b.rows.append([s, str(r["counts"].get("instances_started", 0)),
                       f"{tp['scale_up_rate_99_per_s']:.1f}", _ms(sl["p50"]), _ms(sl["p99"]),
                       _ms(r["cold_start_latency_s"]["p99"]),
                       "-" if s.startswith("galaxy") else f"galaxy {x:.1f}x",
                       _cpu_per_start(r)])  # fmt: skip
    return [a, b]


def scalability(
    cal: Calibration, seed: int, quick: bool, log: Log, progress: bool
) -> list[Section]:
    """Experiment 2: maximum scale-ups/s vs instances of each control function."""
    counts = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32]
    sec = Section(
        "Maximum scale-up rate vs control function instances (Galaxy, caches on, 1,000 nodes,"
        " emulated sandboxes)",
        ["instances of each", "offered/s", "instances started", "scale-ups/s", "per instance/s",
         "sched p50 ms", "sched p99 ms"],
    )  # fmt: skip
    cfg = SimConfig(nodes=1000, seed=seed, create_parallelism=64)
    for n in counts:
        offered = 3000.0 * n
        total = int(offered * (0.5 if quick else 1.0))
        # Enough functions that rendezvous hashing spreads them evenly over
        # n Schedule instances (a few hundred functions would not).
        w = flood(total, offered, max(FLOOD_FUNCTIONS, 64 * n), 5.0, seed=seed, **SMALL)
        c = replace(cfg, params={"galaxy": {"instances": n, "controller_scaling": False}})
        r = sec.runs[f"n={n}"] = _run(f"n={n}", "galaxy", w, c, cal, log, progress)
        tp, sl = r["throughput"], r["scheduling_latency_s"]
        sec.rows.append([str(n), f"{offered:.0f}", str(r["counts"].get("instances_started", 0)),
                         f"{tp['scale_up_rate_99_per_s']:.0f}",
                         f"{tp['scale_up_rate_99_per_s'] / n:.0f}", _ms(sl["p50"]),
                         _ms(sl["p99"])])  # fmt: skip
    return [sec]


def ablation(cal: Calibration, seed: int, quick: bool, log: Log, progress: bool) -> list[Section]:
    """Experiment 3: G_1 -> G_n -> G_n-C -> Galaxy on a cold-start-heavy load."""
    cfg = SimConfig(nodes=210, seed=seed)
    dur = 60.0 if quick else 300.0
    shape = BurstShape(trough_rps=10, peak_ratio=256, double_s=20, hold_s=30, fall_s=30,
                       period_s=150, first_s=10)  # fmt: skip
    w = bursty(dur, shape, n_functions=200, seed=seed, cpu_millis=100, memory_mib=128)
    sec = Section(
        f"Ablation on bursty load ({w.notes[0]}), {dur:.0f} s, 210 nodes, n = 4",
        ["variant", "sched p50 ms", "sched mean ms", "sched p99 ms", "probes", "probes/placement",
         "probe wait s", "control CPU ms/placement", "overhead vs previous"],
    )  # fmt: skip
    prev = None
    for v in ["G1", "Gn", "Gn-C", "Gn-CP", "Gn-CPE", "galaxy"]:
        c = replace(cfg, params={v: {"controller_scaling": False}})
        r = sec.runs[v] = _run(v, v, w, c, cal, log, progress)
        sl, n = r["scheduling_latency_s"], r["counts"]
        placed = max(1, n.get("placements", 0))
        mean = sl["mean"]
        delta = "-" if prev is None else f"{mean / prev - 1:+.1%}"
        prev = mean
        sec.rows.append([v, _ms(sl["p50"]), _ms(mean), _ms(sl["p99"]), str(n.get("probes", 0)),
                         f"{n.get('probes', 0) / placed:.2f}",
                         f"{r['sums'].get('probe_wait_s', 0.0):.2f}",
                         f"{r['sums'].get('cpu_s.control', 0.0) / placed * 1000:.3f}",
                         delta])  # fmt: skip
    return [sec]


def cluster_size(
    cal: Calibration, seed: int, quick: bool, log: Log, progress: bool
) -> list[Section]:
    """Experiment 4: 210 -> 10,000 nodes, cold starts in proportion."""
    sizes = [210, 1000, 2000] if quick else [210, 1000, 5000, 10000]
    systems = ["galaxy", "sparrow", "ray", "atoll", "knative"]
    per_node_rate, flood_s = 2.0, 4.0
    sec = Section(
        f"Cluster size sweep: cold starts at {per_node_rate:g}/s per node for {flood_s:g} s "
        "(full Galaxy: starts with 4 instances of each, controller scaling on; "
        "'=n' rows give Sparrow's schedulers / Atoll's SGSs the Schedule instances "
        "Galaxy's controller grew to: the same number of scheduler processes)",
        ["nodes", "system", "schedulers", "instances started", "scale-ups/s",
         "scale-ups/s per scheduler", "sched p50 ms", "sched p99 ms", "unplaced at end",
         "galaxy instances (max)", "platform CPU ms per start", "sim events/s"],
    )  # fmt: skip
    defaults = {"sparrow": SparrowConfig().schedulers, "atoll": AtollConfig().sgs}
    for nodes in sizes:
        rate = per_node_rate * nodes
        total = int(rate * flood_s)
        w = flood(total, rate, FLOOD_FUNCTIONS, flood_s + 20.0, seed=seed, **SMALL)
        cfg = with_params(
            SimConfig(nodes=nodes, seed=seed), "galaxy", max_instances=SWEEP_MAX_INSTANCES
        )
        runs: list[tuple[str, str, SimConfig, int]] = [
            (s, s, cfg, defaults.get(s, 1 if s == "knative" else 0)) for s in systems
        ]
        galaxy_n = 0
        while runs:
            label, s, c, schedulers = runs.pop(0)
            r = sec.runs[f"{nodes}/{label}"] = _run(f"{nodes} nodes {label}", s, w, c, cal, log,
                                                     progress)  # fmt: skip
            tp, sl = r["throughput"], r["scheduling_latency_s"]
            ctl = r["series"]["control_instances"]
            top = "-"
            if s == "galaxy":
                most = {k: max(p[1] for p in ctl[k]) for k in ("dispatch", "schedule",
                        "clustermgr") if k in ctl}  # fmt: skip
                top = "/".join(str(v) for v in most.values()) or "-"
                schedulers = most.get("schedule", 0)
                if label == "galaxy":
                    galaxy_n = schedulers
                # Same number of scheduler processes for the partitioned
                # baselines, and Galaxy itself with them all from the start
                # (what pre-warmed control functions would give).
                runs += [(f"{b} =n", b, replace(c, params={b: {key: galaxy_n}}), galaxy_n)
                         for b, key in (("sparrow", "schedulers"), ("atoll", "sgs"))
                         if label == "galaxy" and galaxy_n and galaxy_n != defaults[b]]  # fmt: skip
                if label == "galaxy" and galaxy_n > 4:
                    fixed = {"controller_scaling": False, "instances": galaxy_n}
                    runs.append(("galaxy =n fixed", "galaxy",
                                 with_params(c, "galaxy", **fixed), galaxy_n))  # fmt: skip
                    # The controller again, with warm standbys of each kind
                    # (promoted without a process start).
                    sb = with_params(c, "galaxy", standby=STANDBY)
                    runs.append((f"galaxy +{STANDBY} standby", "galaxy", sb, 0))
            if s == "ray":
                schedulers = nodes  # bottom-up: every raylet schedules
            rate_s = tp["scale_up_rate_99_per_s"]
            per = f"{rate_s / schedulers:.0f}" if schedulers else "-"
            sec.rows.append([str(nodes), label, str(schedulers or "-"),
                             str(r["counts"].get("instances_started", 0)), f"{rate_s:.0f}", per,
                             _ms(sl["p50"]), _ms(sl["p99"]), str(r["scale_ups_unplaced_at_end"]),
                             top, _cpu_per_start(r),
                             f"{r['perf']['events_per_s']:,.0f}"])  # fmt: skip
    return [sec]


def _cpu_per_start(r: dict[str, Any]) -> str:
    """CPU of every process of the system (control plane and request
    routing) per instance started, ms: its inverse is the scale-up rate one
    core of control plane carries, the equal-CPU comparison."""
    started = r["counts"].get("instances_started", 0)
    cpu = r["sums"].get("cpu_s.platform")
    if cpu is None:
        return "n/a"  # a latency model (Knative-like): no CPU to compare
    return f"{cpu / started * 1000:.2f}" if started else "-"


STUDIES: dict[str, Callable[[Calibration, int, bool, Log, bool], list[Section]]] = {
    "overall": overall,
    "scalability": scalability,
    "ablation": ablation,
    "cluster-size": cluster_size,
}
