"""Per-plan summaries: latencies, throughput, ratios to the raw echo, and
CPU cost per request, from the load generator's output and /metrics scrapes."""

from __future__ import annotations

import math
from typing import Any

from controlplane.bench import experiment as ex
from controlplane.bench import plan as pl
from controlplane.bench import promscrape as ps

SCHED_HIST = "galaxy_scheduling_latency_seconds"
PROBE_HIST = "galaxy_probe_round_trip_seconds"
COLD_HIST = "galaxy_cold_start_latency_seconds"
GC_HIST = "galaxy_gc_pause_seconds"
# A request travels as a unary call or as a DispatchStream message.
DISPATCH_HANDLER_HISTS = (
    "galaxy_rpc_latency_seconds{method=Dispatch/Dispatch}",
    "galaxy_rpc_latency_seconds{method=Dispatch/DispatchStream}",
)


def merge_runs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two echo runs as one (counts and samples added)."""
    out = dict(a)
    for k in ("ok", "measured", "rpcs", "duration_s", "cpu_s"):
        out[k] = a[k] + b[k]
    out["lat_ms"] = a["lat_ms"] + b["lat_ms"]
    errors = dict(a["errors"])
    for code, n in b["errors"].items():
        errors[code] = errors.get(code, 0) + n
    out["errors"] = errors
    return out


def cpu_costs(p: dict[str, Any]) -> None:
    """CPU milliseconds per completed request, by kind of process, for Galaxy
    and for the echo; and their ratio (``ratio_to_echo.cpu_per_request``).

    On a machine shared with other work, throughput moves with what the
    others do, but the CPU a request costs moves much less: this ratio is the
    throughput ratio to expect where both are limited by CPU alone. Galaxy's
    total includes its fixed background work (node heartbeats), spread over
    the requests of the measured phase.
    """
    rps = p["throughput"]["requests_per_s"]
    groups: dict[str, float] = {}
    for k, v in p.get("cpu_cores", {}).items():
        g = k.rsplit("-", 1)[0] if k[-1:].isdigit() else k
        groups[g] = groups.get(g, 0.0) + (0.0 if v is None or math.isnan(v) else v)
    costs = {g: div(v * 1000.0, rps) for g, v in groups.items()}
    costs["total"] = div(sum(groups.values()) * 1000.0, rps)
    p["cpu_ms_per_request"] = costs
    e = p["baseline"]["echo"]
    evals = list(e.get("cpu_cores", {}).values())
    known = evals and all(v is not None and not math.isnan(v) for v in evals)
    ecores = sum(evals) if known else math.nan
    e["cpu_ms_per_request"] = div(ecores * 1000.0, e["requests_per_s"])
    p["ratio_to_echo"]["cpu_per_request"] = div(e["cpu_ms_per_request"], costs["total"])


def div(a: float, b: float) -> float:
    """a / b, NaN when b is 0 (a phase that measured nothing)."""
    return a / b if b else math.nan


def cores(snaps: list[dict[str, float]], res: dict[str, Any]) -> dict[str, float]:
    """CPU cores each process used over the measured phase (CPU s / wall s)."""
    out = {"load_generator": div(res["cpu_s"], res["duration_s"])}
    if len(snaps) >= 2:
        a, b = snaps[0], snaps[-1]
        for k in sorted(set(a) & set(b)):
            out[k] = div(b[k] - a[k], res["duration_s"])
    return out


def machine_cores(
    a: dict[str, float], b: dict[str, float], cluster: dict[str, float]
) -> dict[str, float]:
    """The machine's CPU over a phase, in cores, from two ``machine_cpu``
    readings: ``busy`` (all processes), ``steal`` (the hypervisor's), ``ours``
    (the cluster and load generator, from ``cluster``: ``cores`` output) and
    ``others`` = busy - ours + steal: the cores other work took from us, which
    a model of this machine must take away too. Empty without readings."""
    if not a or not b or b["at"] <= a["at"]:
        return {}
    wall = b["at"] - a["at"]
    busy = (b["busy"] - a["busy"]) / wall
    steal = (b["steal"] - a["steal"]) / wall
    ours = sum(v for v in cluster.values() if not math.isnan(v))
    return {"busy": busy, "steal": steal, "ours": ours, "others": max(0.0, busy - ours) + steal}


def gc_pauses(scr: dict[str, list[ps.Scrape]]) -> dict[str, dict[str, Any]]:
    """Garbage-collector pauses of the Schedule and Dispatch processes over
    the measured phase, and of the node agents and ClusterMgr together
    (``others``): count, total seconds and cumulative bucket counts (upper
    bound in seconds -> pauses at most that long)."""
    out = {}
    roles = {"schedule": ("s0", "s1"), "dispatch": ("d0", "d1"), "others": ("o0", "o1")}
    for role, (a, b) in roles.items():
        if a not in scr or b not in scr:
            continue
        h = ps.histogram_delta(scr[a], scr[b], GC_HIST)
        full = ps.histogram_delta(scr[a], scr[b], GC_HIST + "{generation=2}")
        out[role] = {
            "count": h.count,
            "sum_s": h.sum,
            "buckets": {repr(k): v for k, v in sorted(h.buckets.items())},
            # Full collections (generation 2): the long pauses, which
            # freezing the start-up heap is meant to shorten.
            "full": {
                "count": full.count,
                "sum_s": full.sum,
                "max_bucket_s": _top_bucket(full),
            },
        }
    return out


def _top_bucket(h: ps.Histogram) -> float:
    """The longest observation's bucket: the smallest upper bound whose
    cumulative count holds them all (inf: beyond the last finite one);
    NaN for an empty histogram."""
    if h.count <= 0:
        return math.nan
    return min((b for b, c in h.buckets.items() if c >= h.count), default=math.nan)


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def add_same_rate_echo(out: dict[str, Any], res: dict[str, Any]) -> None:
    """Add the raw echo run on the plan's own open-loop schedule to a plan's
    entry: ``baseline.echo_same_rate``, and ``ratio_to_echo.warm_p99`` (the
    plan's warm p99 over the echo's p99 at the same rate: how much of the
    tail is Galaxy's rather than the machine's)."""
    dur = res["duration_s"]
    lat = ex.summarize(res["lat_ms"])
    out["baseline"]["echo_same_rate"] = {
        "requests_per_s": res["ok"] / dur if dur else math.nan,
        "errors": sum(res["errors"].values()),
        "latency_ms": lat,
        "send_lag": ex.summarize(res["lag_ms"]),
    }
    warm = out["latency_ms"]["warm_dispatch"]
    if warm.get("count") and lat.get("count"):
        out["ratio_to_echo"]["warm_p99"] = _ratio(float(warm["p99"]), float(lat["p99"]))


def summarize_plan(
    plan: ex.Plan,
    cp: dict[str, Any],
    s: pl.LoadSettings,
    wl: pl.Workload,
    res: dict[str, Any],
    echo_res: dict[str, Any],
    scr: dict[str, list[ps.Scrape]],
) -> dict[str, Any]:
    """One plan's entry in results.json (raw samples under ``_samples``)."""
    lat, cold, wait = res["lat_ms"], res["cold"], res["wait_ms"]
    warm_lat = [v for v, c in zip(lat, cold, strict=True) if not c]
    cold_lat = [v for v, c in zip(lat, cold, strict=True) if c]
    cold_wait = [v for v, c in zip(wait, cold, strict=True) if c]
    n_cold = len(cold_lat)
    dur = res["duration_s"]
    # Placements from capacity credits are decided (and timed) in Dispatch.
    credit_sched = ps.histogram_delta(scr["d0"], scr["d1"], SCHED_HIST)
    sched = ps.histogram_delta(scr["s0"], scr["s1"], SCHED_HIST) + credit_sched
    scale_up = ps.histogram_delta(scr["d0"], scr["d1"], COLD_HIST)
    tput = {
        "duration_s": dur,
        "requests_per_s": res["ok"] / dur if dur else math.nan,
        "rpcs_per_s": res["rpcs"] / dur if dur else math.nan,
        "instances_per_s": n_cold / dur if dur else math.nan,
        "placements_per_s": sched.count / dur if dur else math.nan,
        # Of them, those a capacity credit placed (Dispatch's own histogram):
        # the mix of credit and Schedule decisions.
        "credit_placements_per_s": credit_sched.count / dur if dur else math.nan,
        # Probe RPCs Schedule sent per placement (the probe cache cuts this).
        "probes_per_placement": div(
            ps.counter_delta(scr["s0"], scr["s1"], "galaxy_probes_total"), sched.count
        ),
    }
    echo_dur = echo_res["duration_s"]
    echo_rps = echo_res["ok"] / echo_dur if echo_dur else math.nan
    errors = sum(res["errors"].values())
    return {
        "label": plan.label,
        "scenario": plan.scenario.name,
        "params": plan.params,
        "config": {k: v for k, v in cp.items() if k != "n"},
        "load": {
            "mode": s.mode,
            "concurrency": s.concurrency,
            "arrival_rate": s.arrival_rate if s.mode == "open" else None,
            "cold_fraction": s.cold_fraction,
            "total_requests": len(wl.requests),
            "warmup_requests": wl.warmup,
            "functions": len(wl.functions),
            "note": wl.note,
        },
        "requests": {
            "measured": res["measured"],
            "ok": res["ok"],
            "errors": errors,
            "warm": res["ok"] - n_cold,
            "cold": n_cold,
            "not_sent": res["not_sent"],
        },
        "errors_by_code": res["errors"],
        "release_errors_by_code": res["release_errors"],
        "prime_errors_by_code": res["prime_errors"],
        "latency_ms": {
            "warm_dispatch": ex.summarize(warm_lat),
            "cold_start": ex.summarize(cold_lat),
            "cold_start_dispatch_wait": ex.summarize(cold_wait),
            "scheduling": sched.summary_ms(),
            "probe_round_trip": ps.histogram_delta(scr["s0"], scr["s1"], PROBE_HIST).summary_ms(),
            "scale_up_in_dispatch": scale_up.summary_ms(),
            "send_lag": ex.summarize(res["lag_ms"]),
            # Dispatch's own handler time (its interceptor's histogram): what
            # of the client's warm latency is spent inside the servicer.
            "dispatch_handler": sum(
                (ps.histogram_delta(scr["d0"], scr["d1"], h) for h in DISPATCH_HANDLER_HISTS),
                ps.Histogram(),
            ).summary_ms(),
        },
        "throughput": tput,
        # Dispatch's credit decisions alone, as cumulative bucket counts (upper
        # bound s -> count): simulate-calibrate reads their distribution.
        "credit_decision_buckets": {str(k): v for k, v in sorted(credit_sched.buckets.items())},
        "baseline": {
            "echo": {
                "concurrency": echo_res["concurrency"],
                "requests_per_s": echo_rps,
                "duration_s": echo_dur,
                "errors": sum(echo_res["errors"].values()),
                "latency_ms": ex.summarize(echo_res["lat_ms"]),
            }
        },
        "ratio_to_echo": {
            k: _ratio(float(tput[k]), echo_rps)
            for k in ("requests_per_s", "rpcs_per_s", "instances_per_s", "placements_per_s")
        },
        "_samples": {"t_ms": res["t_ms"], "lat_ms": lat, "cold": cold},
    }
