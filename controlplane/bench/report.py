"""Bench outputs: ``results.json`` (machine-readable), ``report.md`` (for a
person), ``samples.json`` (raw per-request latencies) and PNG plots."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

STATS = ("count", "mean", "stddev", "p50", "p90", "p95", "p99")
LATENCIES = (
    ("warm_dispatch", "warm dispatch (client, from intended send)"),
    ("cold_start", "cold start: request to instance ready (client)"),
    ("cold_start_dispatch_wait", "cold start as seen by Dispatch (wait_ms)"),
    ("scheduling", "scheduling: Schedule request to placement (histogram)"),
    ("scale_up_in_dispatch", "scale-up trigger to ready in Dispatch (histogram)"),
    ("send_lag", "load generator lateness (open loop)"),
    ("dispatch_handler", "Dispatch's handler alone (histogram, 0.1-10 ms buckets)"),
)


def clean(x: Any) -> Any:
    """NaN/inf -> None recursively, so the JSON is standard JSON."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    return x


def write_all(results: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """Write results.json, samples.json, report.md and (``plots``) the plots;
    returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    samples = {str(i): p.pop("_samples", {}) for i, p in enumerate(results["plans"])}
    figures = write_plots(results, samples, out) if plots else []
    results["plots"] = [p.name for p in figures]
    paths = [out / "results.json", out / "samples.json", out / "report.md"]
    paths[0].write_text(json.dumps(clean(results), indent=2, allow_nan=False) + "\n")
    paths[1].write_text(json.dumps(clean(samples), allow_nan=False) + "\n")
    paths[2].write_text(markdown(results))
    return paths + figures


CPU_GROUPS = ("load_generator", "dispatch", "schedule", "agent", "clustermgr", "controller")
CPU_GROUPS_HEAD = ["plan", *CPU_GROUPS, "total", "echo: client / server"]


def _cpu_cells(p: dict[str, Any]) -> list[str]:
    c = p.get("cpu_cores") or {}
    sums = [sum(v for k, v in c.items() if k.startswith(g) and v is not None) for g in CPU_GROUPS]
    e = p["baseline"]["echo"].get("cpu_cores") or {}
    echo = f"{_f(e.get('load_generator'))} / {_f(e.get('echo_server'))}"
    return [*(_f(v) for v in sums), _f(sum(sums)), echo]


def _f(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown(r: dict[str, Any]) -> str:
    """The human report."""
    m = r["machine"]
    out = [
        f"# Bench: {r['experiment']}\n",
        f"- file: `{r['file']}`\n- command: `{r['command']}`",
        f"- started {r['started_at']}, finished {r.get('finished_at', '?')}",
        f"- machine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, {m['platform']}",
        f"- load average at start {_f(m['loadavg'][0])}, at end "
        f"{_f(m.get('loadavg_end', [math.nan])[0])} (other work on the machine moves the "
        "absolute figures; ratios to the raw echo measured beside each plan move less)\n",
    ]
    plans = r["plans"]
    if r["objectives"]:
        out.append("## Objectives\n")
        rows = []
        for p in plans:
            for o in p.get("objectives", []):
                met = {True: "met", False: "**missed**", None: "not measured"}[o["met"]]
                rows.append([p["label"], o["objective"], _f(o["value"]), met])
        out.append(_table(["plan", "objective", "measured", ""], rows) if rows else "")
        out.append("Objectives: " + "; ".join(r["objectives"]) + "\n")
    out.append("## Throughput (ratio = figure / raw grpc.aio echo at the same concurrency)\n")
    rows = []
    for p in plans:
        t, q, e, ld = p["throughput"], p["ratio_to_echo"], p["baseline"]["echo"], p["load"]
        rows.append(
            [
                p["label"],
                ld["mode"],
                str(ld["concurrency"]),
                _f(ld["arrival_rate"], 0),
                _f(t["requests_per_s"], 0),
                _f(q["requests_per_s"]),
                _f(t["rpcs_per_s"], 0),
                _f(q["rpcs_per_s"]),
                _f(t["instances_per_s"], 0),
                _f(q["instances_per_s"]),
                f"{_f(e['requests_per_s'], 0)} ({_f(e.get('requests_per_s_before'), 0)}"
                f"/{_f(e.get('requests_per_s_after'), 0)})",
                f"{p['requests']['errors']}/{p['requests']['measured']}",
            ]
        )
    head = ["plan", "mode", "conc", "rate/s", "req/s", "x echo", "RPC/s", "x echo"]
    out.append(_table([*head, "inst/s", "x echo", "echo req/s (before/after)", "errors"], rows))
    out.append(
        "A warm request is two RPCs (Dispatch, then Release); the echo is one. "
        "`inst/s`: cold starts (instances placed and ready) per second. The echo is "
        "measured just before and just after each plan; a wide before/after spread "
        "means other work on the machine moved the figures.\n"
    )
    out.append("## Latency (ms): p50 / p99 (count)\n")
    rows = []
    for p in plans:
        lat = p["latency_ms"]
        cells = [p["label"]]
        for key, _ in LATENCIES[:2] + LATENCIES[3:4]:
            s = lat[key]
            cells.append(f"{_f(s['p50'])} / {_f(s['p99'])} ({_f(s['count'], 0)})")
        cells.append(_f(p["throughput"].get("probes_per_placement")))
        cells.append(_f(lat["send_lag"]["p99"]))
        cells.append(_f(p["baseline"]["echo"]["latency_ms"]["p50"]))
        same = p["baseline"].get("echo_same_rate")
        if same is not None:
            e = same["latency_ms"]
            ratio = _f(p["ratio_to_echo"].get("warm_p99"))
            cells.append(f"{_f(e['p50'])} / {_f(e['p99'])} (x{ratio})")
        else:
            cells.append("-")
        rows.append(cells)
    head = ["plan", "warm dispatch", "cold start", "scheduling", "probes/placement"]
    out.append(_table([*head, "lag p99", "echo p50", "echo at the same rate"], rows))
    out.append(
        "`echo at the same rate`: the raw echo sent an open-loop plan's own arrival "
        "schedule, p50 / p99 (x: the plan's warm p99 over it): the machine's floor for "
        "one RPC at that rate.\n"
    )
    out.append("## Full statistics (ms)\n")
    for key, title in LATENCIES:
        rows = [
            [p["label"], *(_f(p["latency_ms"][key].get(s)) for s in STATS)]
            for p in plans
            if p["latency_ms"][key].get("count")
        ]
        if rows:
            out.append(f"### {title}\n")
            out.append(_table(["plan", *STATS], rows))
    if any(p.get("cpu_ms_per_request") for p in plans):
        out.append("## CPU cost per completed request (ms of CPU)\n")
        rows = []
        for p in plans:
            c = p.get("cpu_ms_per_request", {})
            cells = [_f(c.get(g), 3) for g in CPU_GROUPS]
            echo = p["baseline"]["echo"].get("cpu_ms_per_request")
            q = p["ratio_to_echo"].get("cpu_per_request")
            rows.append([p["label"], *cells, _f(c.get("total"), 3), _f(echo, 3), _f(q)])
        head = ["plan", *CPU_GROUPS, "total", "echo total", "echo/Galaxy"]
        out.append(_table(head, rows))
        out.append(
            "What a request costs in CPU moves much less with other work on the machine "
            "than throughput does; `echo/Galaxy` is the throughput ratio to expect where "
            "both are limited by CPU alone. Galaxy's total includes fixed background work "
            "(node heartbeats: agent, clustermgr, and schedule's ModNode), spread over "
            "the measured requests. A cold request's cost includes placing and starting "
            "its instance.\n"
        )
    if any(p.get("cpu_cores") for p in plans):
        out.append("## CPU cores used during the measured phase\n")
        out.append(_table(CPU_GROUPS_HEAD, [[p["label"], *_cpu_cells(p)] for p in plans]))
        out.append(
            "Summed per kind of process. The machine has "
            f"{m['nproc']} cores; what is left of them went to other work on the machine.\n"
        )
    out += _gc_section(plans)
    out += _wait_section(plans)
    errs = [(p["label"], p["errors_by_code"]) for p in plans if p["errors_by_code"]]
    if errs:
        out.append("## Errors by status code\n")
        out.append(_table(["plan", "codes"], [[lb, json.dumps(c)] for lb, c in errs]))
    profiled = [p for p in plans if p.get("profile")]
    if profiled:
        out.append("## Profiles (py-spy, measured phase; share of samples)\n")
        for p in profiled:
            out.append(f"### {p['label']}\n")
            for proc, info in p["profile"].items():
                top = ", ".join(f"`{f}` {s:.0%}" for f, s in info["self"][:6])
                tot = ", ".join(f"`{f}` {s:.0%}" for f, s in info["total"][:8])
                out.append(f"- **{proc}** ({info['samples']} samples) self: {top}")
                out.append(f"  - total: {tot}")
            out.append("")
    if r.get("failures"):
        out.append("## Failed plans\n")
        out += [f"- {f['label']}: {f['error']}" for f in r["failures"]]
        out.append("")
    for name in r.get("plots", []):
        out.append(f"![{name}]({name})\n")
    return "\n".join(out) + "\n"


def _gc_section(plans: list[dict[str, Any]]) -> list[str]:
    """Garbage-collector pauses over the measured phase, by role: all
    collections, and the full (generation 2) ones that make a tail."""
    rows = []
    for p in plans:
        for role, g in p.get("gc_pauses", {}).items():
            full = g.get("full", {})
            rows.append(
                [
                    p["label"],
                    role,
                    _f(g["count"], 0),
                    _f(g["sum_s"] * 1000.0),
                    _f(full.get("count"), 0),
                    _f(full.get("sum_s", math.nan) * 1000.0),
                    _f(full.get("max_bucket_s", math.nan) * 1000.0),
                ]
            )
    if not rows:
        return []
    head = ["plan", "processes", "pauses", "total ms", "full", "full total ms", "longest <= ms"]
    return ["## Garbage-collector pauses (measured phase)\n", _table(head, rows)]


def _wait_section(plans: list[dict[str, Any]]) -> list[str]:
    """The share of the measured phase each process's event loop was ready
    to run but waited for a CPU (/proc/PID/schedstat): CPU contention."""
    waits = [p for p in plans if p.get("run_queue_wait")]
    if not waits:
        return []
    names = sorted({k for p in waits for k in p["run_queue_wait"]})
    rows = [[p["label"], *(_f(p["run_queue_wait"].get(k), 3) for k in names)] for p in waits]
    return [
        "## Waiting for a CPU (share of the measured phase; event-loop thread)\n",
        _table(["plan", *names], rows),
        "A request that arrives while its process waits for a CPU waits as long; "
        "on 2 cores this is where other work on the machine enters the tail.\n",
    ]


def write_plots(r: dict[str, Any], samples: dict[str, Any], out: Path) -> list[Path]:
    """latency_cdf.png, throughput.png, timeline.png (none, with a note on
    stderr, when matplotlib is not installed: the figures are in the report)."""
    from controlplane.runtime.extras import MissingExtra, require

    try:
        matplotlib = require("matplotlib", "galaxy bench's PNG plots")
    except MissingExtra as e:
        print(f"galaxy bench: no plots: {e}", file=sys.stderr)
        return []

    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt

    plans = r["plans"]
    if not plans:
        return []
    paths = []
    labels = [p["label"] for p in plans]

    fig, ax = plt.subplots(figsize=(9, 5))
    for i, p in enumerate(plans):
        s = samples[str(i)]
        for flag, style, kind in ((0, "-", "warm"), (1, "--", "cold")):
            v = sorted(x for x, c in zip(s["lat_ms"], s["cold"], strict=True) if c == flag)
            if v:
                ys = [(k + 1) / len(v) for k in range(len(v))]
                ax.plot(v, ys, style, label=f"{p['label']} ({kind})")
    ax.set_xscale("log")
    ax.set_xlabel("latency from intended send (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{r['experiment']}: latency CDF (solid warm dispatch, dashed cold start)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    paths.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(plans) + 3), 5))
    xs = range(len(plans))
    w = 0.27
    series = (
        ("Galaxy requests/s", [p["throughput"]["requests_per_s"] for p in plans], -w),
        ("instances placed/s", [p["throughput"]["instances_per_s"] for p in plans], 0.0),
        ("raw echo requests/s", [p["baseline"]["echo"]["requests_per_s"] for p in plans], w),
    )
    for name, vals, off in series:
        ax.bar([x + off for x in xs], [_z(v) for v in vals], w, label=name)
    for x, p in zip(xs, plans, strict=True):
        q = p["ratio_to_echo"]["requests_per_s"]
        ax.annotate(f"{_f(q)}x", (x - w, _z(p["throughput"]["requests_per_s"])), ha="center")
    ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("per second")
    ax.set_title(f"{r['experiment']}: throughput (labels: ratio to raw echo)")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "throughput.png"))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, p in enumerate(plans):
        s = samples[str(i)]
        done = sorted(t + lt for t, lt in zip(s["t_ms"], s["lat_ms"], strict=True))
        if not done:
            continue
        bin_ms = max(50.0, done[-1] / 60)
        counts: dict[int, int] = {}
        for d in done:
            counts[int(d // bin_ms)] = counts.get(int(d // bin_ms), 0) + 1
        ks = range(max(counts) + 1)
        ax.plot(
            [k * bin_ms / 1000 for k in ks],
            [counts.get(k, 0) * 1000 / bin_ms for k in ks],
            label=p["label"],
        )
    ax.set_xlabel("time since the measured phase began (s)")
    ax.set_ylabel("completed requests/s")
    ax.set_title(f"{r['experiment']}: throughput over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "timeline.png"))
    return paths


def _z(v: Any) -> float:
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rerender(out: Path) -> list[Path]:
    """Rewrite report.md and plots of an earlier run from its results.json and
    samples.json (after a change to the report, without running it again)."""
    from controlplane.bench.summary import cpu_costs

    results = json.loads((out / "results.json").read_text())
    samples = json.loads((out / "samples.json").read_text())
    for i, p in enumerate(results["plans"]):
        p["_samples"] = samples[str(i)]
        if "cpu_cores" in p:
            cpu_costs(p)
    return write_all(results, out)


def main(argv: list[str] | None = None) -> int:
    """``python -m controlplane.bench.report DIR...``: re-render reports."""
    import sys

    for d in argv if argv is not None else sys.argv[1:]:
        for path in rerender(Path(d)):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
