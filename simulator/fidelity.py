"""``galaxy simulate-fidelity``: one scenario simulated and run for real.

The scenario is the bench's cold-start burst (experiments/cold-burst.yaml):
210 emulated nodes, one instance of each control function, both caches,
every request cold-starts an instance (256 functions of concurrency 1, each
request keeping its lease). Phase ``max``: closed loop, 32 requests in
flight, for the maximum throughput. Phase ``half``: open-loop Poisson at half
the real ``max`` throughput, for latencies.

Real side: the bench runner (``controlplane.bench.runner.run_bench``) starts
the cluster with `galaxy up` machinery and drives it with the bench load
generator; scheduling latency is Schedule's own histogram
(``galaxy_scheduling_latency_seconds``: in Schedule, request received ->
placement decided; in Dispatch, a credit's ``take``).

Simulated side: the same cluster on one machine -- every process (control
functions, the two node-agent processes of 105 nodes each, the load
generator) shares the machine's cores (``Host``), loopback delays and the
calibration's costs -- and the same requests. The simulated scheduling
latency is measured over the same spans (Schedule's receipt to decision
for the starts it places; a capacity credit's ``take`` on Dispatch for the
others, as ``functions.dispatch.peers`` times it) and read through the same
histogram buckets, so both sides are quantiles interpolated in the same
buckets; the share of credit decisions is reported beside.

The check passes when p50 and p99 scheduling latency (phases ``half`` and
``max``: at two loads) and throughput (phase ``max``) agree within 25%.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from controlplane.bench.experiment import RequestProfile
from controlplane.bench.plan import BenchFileError
from simulator import calibration, report
from simulator.calibrate_decisions import at_load
from simulator.cliconfig import DEFAULT_REPEAT
from simulator.fidelity_compare import (  # noqa: F401 (re-exported)
    TOLERANCE,
    _summ,
    compare,
    compare_runs,
    diagnostics,
)
from simulator.fidelity_load import DispatchStreamClient, Driver
from simulator.galaxy import VARIANTS, GalaxyModel
from simulator.loop import REPLY_STEPS, REQUEST_STEPS
from simulator.network import NetworkConfig
from simulator.system import Env, SimConfig
from simulator.workload import Workload, functions

#: Threads a gRPC message to an idle Python process passes through: an
#: event-engine thread reads the socket, grpc.aio's poller thread takes the
#: completion, the asyncio loop runs the handler (a Galaxy process runs 4
#: ``event_engine`` threads, a poller and its loop: /proc/PID/task).
GRPC_HANDOFFS = 3
#: Each process an asyncio event loop (``simulator.loop``), not a FIFO queue.
EVENT_LOOPS = True
#: Scale op costs per process to the real run's CPU (``speed_factors``).
SCALE_TO_RUN = True
HOLD_S = 1e9  # a cold request keeps its lease (its instance) to the end
COLD_FUNCTIONS = 256
#: Requests per phase (max, half), full and ``--quick``. p99 sits among the
#: 3-7% of placements that probe, so 6,000 requests give ~300 samples of
#: that tail (2,000 gave ~100, and one run's p99 moved 2.5x between runs).
REQUESTS = {False: (3000, 6000), True: (1200, 1500)}
#: Each real run is simulated with this many seeds; each metric's median
#: over them is compared (the simulated tail has sampling noise too).
SIM_SEEDS = 3


#: Functions of the warm pool each plan deploys (unused: every request is
#: cold; the bench always deploys at least one).
WARM_FUNCTIONS = 1
PHASES = ("max", "half")


def max_functions() -> int:
    """The controller's function limit the real run needs: each phase's
    plan deploys its own pools into the same cluster (the default limit of
    500 refused the second phase's 256)."""
    return len(PHASES) * (COLD_FUNCTIONS + WARM_FUNCTIONS)


def bench_doc(nodes: int, quick: bool, credits: bool = True) -> dict[str, Any]:
    """The real side's bench file."""
    n_max, n_half = REQUESTS[quick]
    common = {"cold_fraction": 1.0, "cold_functions": COLD_FUNCTIONS,
              "warm_functions": WARM_FUNCTIONS}  # fmt: skip
    return {
        "name": "fidelity",
        "control_plane": {"nodes": nodes, "start_delay_ms": 0, "credits": credits,
                          "max_functions": max_functions()},
        "load": {"seed": 2, "echo_requests": 1000, "echo_max_s": 1.0, "concurrency": 32},
        "scenarios": [
            {"name": "max", "mode": "closed", "total_requests": n_max,
             "warmup_requests": n_max // 10, **common},
            {"name": "half", "rate_of": {"scenario": "max", "fraction": 0.5},
             "total_requests": n_half, "warmup_requests": n_half // 10,
             "request_profile": {"distribution": "Poisson"}, **common},
        ],
    }  # fmt: skip


class FidelityError(Exception):
    """An expected failure of the command (a real run failed, a bad file):
    reported as one line, not a traceback."""


async def real_side(nodes: int, quick: bool, log: Any, credits: bool = True) -> dict[str, Any]:
    """Run the scenario on a real emulated cluster; the two plans' results."""
    from controlplane.bench import plan as pl
    from controlplane.bench.runner import RunOptions, machine_info, run_bench

    with tempfile.TemporaryDirectory(prefix="galaxy-fidelity-") as tmp:
        bf = pl.parse(bench_doc(nodes, quick, credits), Path(tmp) / "fidelity.yaml")
        res = await run_bench(bf, RunOptions(Path(tmp), Path(tmp), log=log))
    if res["failures"]:
        raise FidelityError(f"the real run failed: {'; '.join(map(str, res['failures']))}")
    out: dict[str, Any] = {"machine": machine_info(), "credits": credits}
    for p in res["plans"]:
        out[p["scenario"]] = {
            "requests": p["requests"],
            "arrival_rate": p["load"]["arrival_rate"],
            "instances_per_s": p["throughput"]["instances_per_s"],
            "scheduling_ms": p["latency_ms"]["scheduling"],
            "probe_round_ms": p["latency_ms"].get("probe_round_trip", {}),
            "cold_start_ms": p["latency_ms"]["cold_start"],
            "loadavg": p.get("loadavg"),
            "machine_cores": p.get("machine_cores", {}),
            "gc_pauses": p.get("gc_pauses", {}),
            "placements": p["throughput"]["placements_per_s"] * p["throughput"]["duration_s"],
            "credit_placements": p["throughput"].get("credit_placements_per_s", math.nan)
            * p["throughput"]["duration_s"],
            "probes_per_placement": p["throughput"]["probes_per_placement"],
            "cpu_cores": p.get("cpu_cores", {}),
        }
    return out


def _bucket_summary(values: list[float]) -> dict[str, float]:
    """p50/p99 in ms read from the Prometheus buckets the real side uses."""
    from controlplane.bench.promscrape import Histogram
    from controlplane.runtime.metrics import SCHEDULING_BUCKETS

    h = Histogram()
    for b in (*SCHEDULING_BUCKETS, math.inf):
        h.buckets[b] = float(sum(1 for v in values if v <= b))
    h.count, h.sum = float(len(values)), float(sum(values))
    return h.summary_ms()


def kernel_slice_s() -> float:
    """Linux's EEVDF base slice: 0.75 ms x (1 + log2(CPUs, at most 8))
    (kernel/sched/fair.c, sysctl_sched_base_slice and its scaling)."""
    cpus = min(os.cpu_count() or 1, 8)
    return 0.00075 * (1 + int(math.log2(cpus)))


def sim_phase(
    cal: calibration.Calibration,
    nodes: int,
    total: int,
    seed: int,
    concurrency: int = 0,
    rate: float = 0.0,
    background: float = 0.0,
    client_cost_s: float | None = None,
    credits: bool = False,
) -> dict[str, Any]:
    """One phase simulated: closed loop with ``concurrency`` or open at ``rate``.

    credits: Galaxy with capacity credits (production's default, the path
    behind the headline figures) or without (the Schedule path only).

    client_cost_s: the load generator's CPU per request as measured in the
    real run (it is the test harness, not the system checked: its open-loop
    timers cost 2-3x a closed-loop call, and its CPU is load on the machine).
    """
    fns = functions(COLD_FUNCTIONS, "cold", cpu_millis=10, memory_mib=16, cold_start_s=0.0)
    w = Workload("fidelity", fns, 600.0, lambda: iter(()))
    hop = cal.param("loopback_hop_s", 50e-6)
    cfg = SimConfig(
        nodes=nodes,
        seed=seed,
        nodes_per_agent=105,
        create_parallelism=10_000,  # emulated sandboxes: a timer each, no limit
        host_cores=os.cpu_count() or 2,
        host_slice_s=kernel_slice_s(),
        host_background=background,
        host_wakeup_s=cal.param("wakeup_s", 0.0),
        host_handoffs=GRPC_HANDOFFS,
        host_wake_cpu_s=cal.param("wake_cpu_s", 0.0),
        host_event_loops=EVENT_LOOPS,
        host_loop_steps=(
            round(cal.param("loop_request_steps", REQUEST_STEPS)),
            round(cal.param("loop_reply_steps", REPLY_STEPS)),
        ),
        network=NetworkConfig(hop, hop * 0.2, 0.0, 0.0),
    )
    env = Env(cfg, cal, w, seed)
    env.sim.slack_s = 0.0  # exact arrival order: processes share the cores
    env.rec.warmup_s = math.inf
    g = VARIANTS["galaxy" if credits else "Gn-CPE"]
    model = GalaxyModel(env, g, instances=1, controller_scaling=False, heartbeats="all")
    lg = env.station("load-generator", platform=False)
    s_client = env.op("client.rpc")
    if client_cost_s is not None and env.host is not None:
        s_client = lambda: client_cost_s  # noqa: E731
        env.host.measured.add(lg)
    client = DispatchStreamClient(env, model, lg, s_client)
    if env.host is not None:
        # The node agents' and ClusterMgr's costs were calibrated whole: in
        # the calibrating runs they sleep between messages (0.1-0.2 cores),
        # so their CPU per op already holds the wake-ups. Charging
        # wake_cpu_s again made their simulated CPU 25-60% above the real
        # (agents 0.21 vs 0.16-0.17 cores, ClusterMgr 0.18 vs 0.11-0.14).
        env.host.measured.update(env.cluster.agents)
        env.host.measured.update(c.station for c in model.control.cmfs.values())
    d = Driver(env, client, total, total // 10, COLD_FUNCTIONS, HOLD_S)
    env.rec.on_grant = client.granted
    if concurrency:

        def next_one(now: float) -> None:  # closed loop: each reply sends the next
            d.on_grant(now)
            d.send()

        client.on_reply = next_one
        for _ in range(concurrency):
            env.sim.at(0.0, d.send)
    else:
        client.on_reply = d.on_grant
        for t in RequestProfile("poisson", rate).arrivals(total, seed):
            env.sim.at(t, d.send)
    model.start()
    env.sim.run(600.0)
    dur = d.t_last - d.t_first
    # Both kinds of placement decision, as the real histogram holds both:
    # Schedule's (request received -> node chosen) and Dispatch's credit
    # takes (the take's own span).
    sched = list(env.rec.extra.get("schedule_decision", []))
    credit = list(env.rec.extra.get("credit_decision", []))
    sched += credit
    return {
        "instances_per_s": (d.granted - d.warmup) / dur if dur > 0 else 0.0,
        "scheduling_ms": _bucket_summary(sched),
        "placements": len(sched),
        "credit_placements": len(credit),
        "probe_round_ms": _bucket_summary(list(env.rec.extra.get("probe_round", []))),
        "scheduling_exact_ms": {k: v * 1000 for k, v in _summ(sched).items() if k != "count"},
        "cold_start_ms": {
            k: v if k == "count" else v * 1000 for k, v in _summ(list(env.rec.cold)).items()
        },
        "probes_per_placement": env.rec.counts["probes"] / max(1, env.rec.counts["placements"]),
        # Each process's CPU over the whole phase (the real side's is over
        # the measured part): where a disagreement comes from.
        "cpu_cores": {st.name: st.busy / env.sim.now for st in env.host.stations}
        if env.host is not None and env.sim.now > 0
        else {},
        "events": env.sim.events,
        "counts": {k: env.rec.counts[k] for k in _COUNTS},
    }


#: Event counts of a simulated phase kept in its result (which path the
#: starts took: credits or Schedule).
_COUNTS = ("placements", "credit_hits", "credit_misses", "credit_refused", "credit_syncs",
           "probes", "instances_started")  # fmt: skip


def _read_real(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    if "runs" in doc:
        return [r["real"] for r in doc["runs"]]
    return [doc["real"]]  # a single-run file


def _write(out: Path, doc: dict[str, Any], md: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "report.md").write_text(md)


def background_processes(phase: dict[str, Any], cores: int) -> float:
    """How many CPU-bound processes of others the real run of a phase
    shared the machine with (``Host``'s ``background``), from what the bench
    runner measured: the cores others took, ours, and how many of ours were
    runnable on average (/proc/PID/schedstat). With room to spare, others
    took all they wanted; on a full machine they got their fair share,
    cores x k / (k + r) for r of ours, which gives k."""
    m = phase.get("machine_cores", {})
    others, ours = float(m.get("others", 0.0)), float(m.get("ours", 0.0))
    r = float(m.get("ours_runnable", 0.0))
    if others <= 0.0:
        return 0.0
    if ours + others < 0.9 * cores or r <= 0.0:
        return others
    return others * r / max(0.1, cores - others)


async def _calibration(args: Any, log: Any) -> calibration.Calibration:
    """The costs to simulate with: measured here and now by default, since a
    shared machine's speed moves (the echo's CPU per call changed 2x within
    a day on the reference VM), or the shipped or a given file."""
    if args.calibration == "measure":
        if args.real:
            doc = json.loads(await asyncio.to_thread(Path(args.real).read_text))
            if "calibration" in doc:  # the one measured with that real run
                return calibration.parse(
                    _with_new_ops(doc["calibration"]), f"{args.real}: calibration"
                )
            return calibration.load(None)
        from simulator import calibrate

        log("calibrating on this machine (galaxy simulate-calibrate --repeat 1)")
        try:
            return await calibrate.measure(args.nodes, args.quick, log, repeat=1)
        except RuntimeError as e:  # a calibration run failed: one line, no traceback
            raise FidelityError(f"calibrating failed: {e}") from None
    return calibration.load(None if args.calibration == "shipped" else args.calibration)


def _with_new_ops(doc: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's calibration, with the ops it predates (their
    shipped figures; e.g. ``dispatch.credit_take``) filled in."""
    shipped = calibration.load(None).to_json()["ops"]
    return {**doc, "ops": {**shipped, **doc.get("ops", {})}}


#: Which process's CPU each op is (the prefix of the op's name).
_PROCESS_OF = {"dispatch": ("dispatch-0",), "schedule": ("schedule-0",),
               "agent": ("agent-0", "agent-1"), "clustermgr": ("clustermgr-0",)}  # fmt: skip


def speed_factors(sim: dict[str, Any], real: dict[str, Any]) -> dict[str, float]:
    """Per process, real CPU / simulated CPU in one phase at the same rate.

    The calibration is a snapshot, and this shared VM's speed drifts by tens
    of percent within minutes (the echo's CPU per call moved 225 -> 320 us
    between two quiet calibrations 20 minutes apart, and the simulated p99
    with it, 1.9 -> 4.4 ms, for the same real runs). Scaling each process's
    op costs by what that process really used in the *half* phase pins the
    costs to the run being checked; the latencies (and the max phase's
    throughput) remain predictions of the model."""
    out = {}
    for prefix, names in _PROCESS_OF.items():
        r = sum(float(real["cpu_cores"].get(n, 0.0)) for n in names)
        sv = sum(float(sim["cpu_cores"].get(n, 0.0)) for n in names)
        out[prefix] = r / sv if r > 0 and sv > 0 else 1.0
    return out


def simulate_run(
    cal: calibration.Calibration, real: dict[str, Any], nodes: int, quick: bool, seed: int
) -> dict[str, Any]:
    """Both phases simulated under one real run's measured conditions, with
    ``SIM_SEEDS`` seeds; each phase's compared metrics are the medians over
    the seeds (``seeds`` keeps every seed's figures). The op costs are first
    scaled per process to the CPU it used in the real half phase
    (``speed_factors``; ``factors`` in the result)."""
    n_max, n_half = REQUESTS[quick]
    credits = bool(real.get("credits", False))  # files before the field ran without
    cores = os.cpu_count() or 2
    bg = {k: background_processes(real[k], cores) for k in ("max", "half")}
    client = {k: client_cost(real[k]) for k in ("max", "half")}
    rate = real["half"]["arrival_rate"]
    factors = {k: 1.0 for k in _PROCESS_OF}
    if SCALE_TO_RUN and real["half"].get("cpu_cores"):
        first = sim_phase(cal, nodes, n_half, seed, rate=rate, background=bg["half"],
                          client_cost_s=client["half"], credits=credits)  # fmt: skip
        factors = speed_factors(first, real["half"])
        cal = cal.scaled(factors)
    out: dict[str, Any] = {"background": bg, "client_cost_s": client, "factors": factors}
    for ph in ("max", "half"):
        kw: dict[str, Any] = {"concurrency": 32} if ph == "max" else {"rate": rate}
        runs = [
            sim_phase(at_load(cal, ph), nodes, n_max if ph == "max" else n_half, s,
                      background=bg[ph], client_cost_s=client[ph], credits=credits, **kw)
            for s in range(seed, seed + SIM_SEEDS)
        ]  # fmt: skip
        out[ph] = _median_of(runs)
    return out


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first seed's phase with the compared metrics replaced by their
    medians over all seeds."""
    med = dict(runs[0])
    med["instances_per_s"] = statistics.median(r["instances_per_s"] for r in runs)
    for key in ("scheduling_ms", "probe_round_ms"):
        if key in runs[0]:
            med[key] = {k: statistics.median(r[key][k] for r in runs) for k in runs[0][key]}
    med["seeds"] = [
        {"instances_per_s": r["instances_per_s"], "scheduling_ms": r["scheduling_ms"]} for r in runs
    ]
    return med


#: Other work (CPU-bound processes) above which a run is flagged.
BUSY_BACKGROUND = 1.0


def busy_runs(sims: list[dict[str, Any]]) -> list[int]:
    """The runs (1-based) during which others' work took a core or more."""
    return [i + 1 for i, s in enumerate(sims) if max(s["background"].values()) >= BUSY_BACKGROUND]


def client_cost(phase: dict[str, Any]) -> float | None:
    """The real load generator's CPU seconds per request in a phase."""
    cores = phase.get("cpu_cores", {}).get("load_generator")
    rate = phase.get("instances_per_s") or 0.0
    if cores is None or not rate > 0 or math.isnan(cores):
        return None
    return float(cores) / rate


async def main(args: Any) -> int:
    """``galaxy simulate-fidelity``: 0 passed, 1 failed the check, 2 could
    not run (one line on stderr naming why)."""
    try:
        return await _main(args)
    except (FidelityError, calibration.CalibrationError, BenchFileError, OSError,
            json.JSONDecodeError, KeyError) as e:  # fmt: skip
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        print(f"galaxy simulate-fidelity: {what}", file=sys.stderr)
        return 2


def resolve(args: Any) -> Any:
    """Fill the defaults that depend on --quick: one real run and the
    shipped calibration for a smoke test, else three runs and a calibration
    measured here and now."""
    return args.model_copy(update={
        "repeat": args.repeat or (1 if args.quick else DEFAULT_REPEAT),
        "calibration": args.calibration or ("shipped" if args.quick else "measure"),
    })  # fmt: skip


async def _main(args: Any) -> int:
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    args = resolve(args)
    cal = await _calibration(args, log)
    out = Path(args.out)
    if args.real:
        reals = _read_real(Path(args.real))
    else:
        reals = []
        for i in range(args.repeat):
            log(f"real run {i + 1} of {args.repeat}")
            reals.append(await real_side(args.nodes, args.quick, log, args.credits))
    sims = [simulate_run(cal, r, args.nodes, args.quick, args.seed) for r in reals]
    rows, ok = compare_runs(list(zip(sims, reals, strict=True)))
    header = ["metric", "simulated (median)", "real (median)", "sim/real by run",
              "median sim/real", f"within {TOLERANCE:.0%}"]  # fmt: skip
    table = report.md_table(header, rows)
    diag = report.md_table(
        ["shown, not judged", "simulated (median)", "real (median)"],
        diagnostics(list(zip(sims, reals, strict=True))),
    )
    facs = "; ".join(
        f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in s["factors"].items())
        for i, s in enumerate(sims)
    )
    bgs = "; ".join(
        f"run {i + 1}: max {s['background']['max']:.2f}, half {s['background']['half']:.2f}"
        for i, s in enumerate(sims)
    )
    doc = {"runs": [{"sim": s, "real": r} for s, r in zip(sims, reals, strict=True)],
           "ok": ok, "rows": rows, "calibration": cal.to_json()}  # fmt: skip
    _write(out, doc, f"# Fidelity: simulation vs emulated cluster ({args.nodes} nodes)\n\n"
           f"{table}\n\n{diag}\n\nOther work on the machine (CPU-bound processes, estimated from "
           f"what each real run measured and simulated as background): {bgs}.\n\n"
           f"Op costs scaled per process to the run's own CPU in the half phase "
           f"(real / simulated): {facs}.\n\n"
           f"Calibration: {cal.meta.get('method', '')} "
           f"{cal.meta.get('measured_at', '')}\n")  # fmt: skip
    print(table)
    print(diag)
    print(f"other work on the machine (CPU-bound processes): {bgs}")
    print(f"op costs scaled per process to the run's own CPU (real / simulated): {facs}")
    busy = busy_runs(sims)
    if busy:
        print(
            f"warning: other users' work took a core or more in run(s) {busy}; the model "
            "of it is the least certain part of the check (docs/simulator.md, Fidelity): "
            "rerun on a quieter machine to test the rest",
            file=sys.stderr,
        )
    print("fidelity check " + ("PASSED" if ok else "FAILED") + f"; wrote {out}/report.md")
    return 0 if ok else 1
