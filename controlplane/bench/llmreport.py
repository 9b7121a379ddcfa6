"""LLM bench outputs, in the layout of the control-plane bench's report
(``report.py``): ``results.json``, ``samples.json`` (every request's chunk
times) and ``report.md`` with a throughput table, a p50/p99 table and the
full statistics (count, mean, stddev, p50/p90/p95/p99) per latency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.bench.llmmetrics import LATENCIES, STATS, TITLES
from controlplane.bench.report import _f, _table, clean

__all__ = ["clean", "markdown", "render_recommendation", "write_all"]


def write_all(results: dict[str, Any], out: Path) -> list[Path]:
    """Write results.json, samples.json and report.md; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    samples = {str(i): p.pop("_samples", []) for i, p in enumerate(results["plans"])}
    paths = [out / "results.json", out / "samples.json", out / "report.md"]
    paths[0].write_text(json.dumps(clean(results), indent=2, allow_nan=False) + "\n")
    paths[1].write_text(json.dumps(clean(samples), allow_nan=False) + "\n")
    paths[2].write_text(markdown(results))
    return paths


def _head(r: dict[str, Any]) -> list[str]:
    m, t = r["machine"], r["trace"]
    return [
        f"# LLM bench: {r['experiment']}\n",
        f"- file: `{r['file']}`\n- command: `{r['command']}`",
        f"- started {r['started_at']}, finished {r.get('finished_at', '?')}",
        f"- machine: {m['nproc']} CPUs, Python {m['python']}, {m['platform']}, "
        f"load average at start {_f(m['loadavg'][0])}",
        f"- trace: Azure LLM inference 2023 `{t['service']}`, {_f(t['duration_s'], 0)} s "
        f"from {_f(t['start_s'], 0)} s, gaps x{_f(t['time_scale'])} "
        f"(replayed in {_f(t['replay_s'], 1)} s: {t['requests']} requests, "
        f"{_f(t['offered_per_s'])}/s offered), tokens x{_f(t['token_scale'])} capped at "
        f"{t['max_prompt_tokens']} in / {t['max_output_tokens']} out\n",
    ]


def markdown(r: dict[str, Any]) -> str:
    """The human report."""
    out = _head(r)
    plans = r["plans"]
    lim = plans[0]["limits"] if plans else {}
    out.append(
        f"## Throughput (goodput: TTFT <= {_f(lim.get('ttft_s'))} s and "
        f"TPOT <= {_f(lim.get('tpot_s'))} s)\n"
    )
    rows = []
    for p in plans:
        t, q = p["throughput"], p["requests"]
        rows.append(
            [
                p["label"],
                str(p["instances"]),
                _f(t["requests_per_s"]),
                _f(t["goodput_per_s"]),
                _f(t["goodput_share"]),
                _f(t["input_tokens_per_s"], 0),
                _f(t["output_tokens_per_s"], 0),
                f"{q['errors']}/{q['sent']}",
            ]
        )
    head = ["plan", "instances", "req/s", "goodput/s", "good share", "in tok/s", "out tok/s"]
    out.append(_table([*head, "errors"], rows))
    out.append("## Latency (ms): p50 / p99 (count)\n")
    rows = []
    for p in plans:
        cells = [p["label"]]
        for k in LATENCIES:
            s = p["latency_ms"][k]
            cells.append(f"{_f(s['p50'])} / {_f(s['p99'])} ({_f(s['count'], 0)})")
        rows.append(cells)
    out.append(_table(["plan", "TTFT", "TPOT", "ITL", "E2E"], rows))
    out.append("## Full statistics (ms)\n")
    for k in LATENCIES:
        rows = [[p["label"], *(_f(p["latency_ms"][k].get(s)) for s in STATS)] for p in plans]
        if rows:
            out.append(f"### {TITLES[k]}\n")
            out.append(_table(["plan", *STATS], rows))
    errs = [(p["label"], p["errors_by_kind"]) for p in plans if p["errors_by_kind"]]
    if errs:
        out.append("## Errors\n")
        out.append(_table(["plan", "kinds"], [[lb, json.dumps(c)] for lb, c in errs]))
    if r.get("failures"):
        out.append("## Failed plans\n")
        out += [f"- {f['label']}: {f['error']}" for f in r["failures"]]
        out.append("")
    out.append("## Definitions\n")
    out.append(r["definitions"].strip())
    return "\n".join(out) + "\n"


def render_recommendation(doc: dict[str, Any]) -> str:
    """``--recommend``'s answer for a person (also printed)."""
    lines = _head(doc)
    lines.append(f"## Recommendation for {', '.join(doc['objectives'])}\n")
    n = doc["recommendation"]
    if n is None:
        lines.append("No instance count tried met the objectives.\n")
    else:
        lines.append(f"**Smallest deployment that meets them: {n} instance(s).**\n")
    rows = []
    for t in doc["trials"]:
        s = t["summary"]
        rows.append(
            [
                str(t["instances"]),
                "pass" if t["passed"] else "fail",
                _f(s["latency_ms"]["ttft"]["p99"]),
                _f(s["latency_ms"]["tpot"]["p99"]),
                _f(s["throughput"]["goodput_per_s"]),
                "; ".join(t["why"]) or "-",
            ]
        )
    head = ["instances", "result", "TTFT p99 ms", "TPOT p99 ms", "goodput/s", "why not"]
    lines.append(_table(head, rows))
    return "\n".join(lines) + "\n"
