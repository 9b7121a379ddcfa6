"""Reports of a simulation: a table, report.md, results.json and PNG plots.

results.json holds only what the seed determines (so one seed gives one
file, byte for byte); wall time and events/s go to perf.json and the
markdown report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PLOTS = ("latency_cdf.png", "throughput.png", "control_instances.png")


def _ms(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1000:.2f}"


def table_rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per system: the comparison everyone asks for first."""
    rows = []
    for name, r in results.items():
        s, d, c = r["scheduling_latency_s"], r["dispatch_latency_s"], r["cold_start_latency_s"]
        tp, n = r["throughput"], r["counts"]
        rows.append(
            [
                name,
                str(s["count"]),
                _ms(s["p50"]),
                _ms(s["p99"]),
                str(r.get("scale_ups_unplaced_at_end", 0)),
                _ms(r.get("scheduling_latency_with_unplaced_s", s)["p99"]),
                _ms(d["p50"]),
                _ms(d["p99"]),
                _ms(c["p99"]),
                f"{tp['requests_per_s']:.1f}",
                f"{tp['scale_up_rate_per_s']:.1f}",
                f"{tp['peak_instances_per_s']:.0f}",
                str(n.get("probes", 0)),
                str(n.get("failed", 0)),
            ]
        )
    return rows


HEADER = [
    "system",
    "placements",
    "sched p50 ms",
    "sched p99 ms",
    "unplaced at end",
    "sched p99 incl. unplaced (a lower bound) ms",
    "dispatch p50 ms",
    "dispatch p99 ms",
    "cold p99 ms",
    "req/s",
    "scale-up/s",
    "peak inst/s",
    "probes",
    "failed",
]


def text_table(results: dict[str, dict[str, Any]]) -> str:
    """The comparison as aligned text (for the terminal)."""
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def perf_rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Simulator speed per system."""
    return [
        [
            name,
            f"{r['perf']['events']:,}",
            f"{r['perf']['wall_s']:.2f}",
            f"{r['perf']['events_per_s']:,.0f}",
        ]
        for name, r in results.items()
    ]


def write(out: Path, meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> list[Path]:
    """Write report.md, results.json, perf.json and the plots into out."""
    out.mkdir(parents=True, exist_ok=True)
    stable = {k: {kk: vv for kk, vv in v.items() if kk != "perf"} for k, v in results.items()}
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "systems": stable}, indent=1, sort_keys=True, default=str)
    )
    (out / "perf.json").write_text(
        json.dumps({k: v["perf"] for k, v in results.items()}, indent=1, sort_keys=True)
    )
    paths = plot(out, results)
    lines = [
        f"# Simulation: {meta.get('workload', {}).get('name', '')}",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        f"Nodes: {meta.get('nodes')}; seed {meta.get('seed')}; network {meta.get('network')}.",
        "",
        *[f"- {n}" for n in meta.get("workload", {}).get("notes", [])],
        "",
        "## Results",
        "",
        md_table(HEADER, table_rows(results)),
        "",
        "Latencies in ms; *sched* = scheduling latency (scale-up asked -> node chosen), "
        "*dispatch* = request arrival -> slot on an instance, *cold* = dispatch latency of "
        "requests that waited for a cold start; *scale-up/s* = instances started per second "
        "from the first scale-up to the last start.",
        "",
        "## Simulator speed",
        "",
        md_table(["system", "events", "wall s", "events/s"], perf_rows(results)),
        "",
        "## Plots",
        "",
        *[f"![{p.stem}]({p.name})" for p in paths],
        "",
        "## Parameters",
        "",
    ]
    for name, r in results.items():
        lines.append(f"- **{name}**: `{json.dumps(r.get('params', {}), default=str)}`")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return [out / "report.md", out / "results.json", out / "perf.json", *paths]


def plot(out: Path, results: dict[str, dict[str, Any]]) -> list[Path]:
    """The three PNG plots; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [out / p for p in PLOTS]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "scheduling_latency_s", "scheduling latency"),
        (axes[1], "dispatch_latency_s", "dispatch latency"),
    ):
        for name, r in results.items():
            q = r["samples"][key]
            if q:
                ys = [i / (len(q) - 1) for i in range(len(q))] if len(q) > 1 else [1.0]
                ax.plot([max(v * 1000, 1e-3) for v in q], ys, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("CDF")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for name, r in results.items():
        ser = r["series"]
        b = ser["bin_s"]
        xs = [i * b for i in range(len(ser["completed"]))]
        axes[0].plot(xs, [c / b for c in ser["completed"]], label=name, lw=1)
        axes[1].plot(xs, [c / b for c in ser["instances_started"]], label=name, lw=1)
    axes[0].set_ylabel("requests done / s")
    axes[1].set_ylabel("instances started / s")
    axes[1].set_xlabel("simulated time (s)")
    axes[0].legend(fontsize=8, ncol=4)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4))
    for name, r in results.items():
        for kind, pts in sorted(r["series"]["control_instances"].items()):
            if not pts:
                continue
            end = max(pts[-1][0], r["series"]["bin_s"] * len(r["series"]["completed"]))
            xs = [p[0] for p in pts] + [end]
            ys = [p[1] for p in pts] + [pts[-1][1]]
            ax.step(xs, ys, where="post", label=f"{name}: {kind}", lw=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("control function instances")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths
