"""What ``galaxy simulate`` does (argument parsing is in ``simulator.cli``)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from simulator import calibration, report
from simulator.experiments import (
    PLAN_HEADER,
    is_experiment_file,
    load_experiment,
    parse_workload,
    plan_config,
    plan_table,
    plan_workload,
)
from simulator.models import DISTRIBUTIONS
from simulator.network import PROFILES
from simulator.runner import SYSTEMS, run_one, with_params
from simulator.sensitivity import sensitivity
from simulator.studies import STUDIES as _STUDIES
from simulator.studies import Section
from simulator.system import SimConfig


class UsageError(ValueError):
    """A bad command line; printed without a traceback."""


#: Every documented experiment, by name.
STUDIES = {**_STUDIES, "sensitivity": sensitivity}


def _systems(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in SYSTEMS]
    if bad or not out:
        raise UsageError(f"--systems: unknown {bad or text!r}; choose from {', '.join(SYSTEMS)}")
    return out


def base_config(args: Any) -> SimConfig:
    """SimConfig from the common flags."""
    if args.network not in PROFILES:
        raise UsageError(f"--network: one of {', '.join(PROFILES)}")
    cfg = SimConfig(
        nodes=args.nodes, seed=args.seed, network=PROFILES[args.network],
        keep_alive_s=args.keep_alive,
    )  # fmt: skip
    models = getattr(args, "models", None)
    if models:
        if models not in DISTRIBUTIONS:
            raise UsageError(f"--models: one of {', '.join(DISTRIBUTIONS)}")
        cfg = replace(cfg, models=models)
        if args.model_locality:
            cfg = with_params(cfg, "galaxy", scoring="model_locality")
    return cfg


def simulate(args: Any, out: TextIO | None = None) -> int:
    """Run ``galaxy simulate``; returns the exit code."""
    out = out or sys.stdout
    cal = calibration.load(args.calibration)
    dest = Path(args.out)
    command = "galaxy simulate " + " ".join(sys.argv[2:])
    if args.experiment:
        return _study(args, cal, dest, command, out)
    if not args.workload:
        raise UsageError("--workload or --experiment is required")
    systems = _systems(args.systems)
    cfg = base_config(args)
    if is_experiment_file(args.workload):
        return _experiment_file(args, cal, cfg, systems, dest, command, out)
    w = parse_workload(args.workload, args.seed)
    results = {
        s: run_one(s, w, cfg, cal, progress=not args.no_progress, until=args.until) for s in systems
    }
    meta = _meta(command, cfg, w.describe(), cal)
    files = report.write(dest, meta, results)
    print(report.text_table(results), file=out)
    print(_speed(results), file=out)
    print(f"wrote {', '.join(str(p) for p in files)}", file=out)
    return 0


def _meta(
    command: str, cfg: SimConfig, workload: dict[str, Any], cal: calibration.Calibration
) -> dict[str, Any]:
    return {
        "command": command,
        "nodes": cfg.nodes,
        "seed": cfg.seed,
        "network": cfg.network.as_dict(),
        "keep_alive_s": cfg.keep_alive_s,
        **({"models": cfg.models} if cfg.models else {}),
        "workload": workload,
        "calibration": {k: v for k, v in cal.meta.items() if isinstance(v, str | int | float)},
    }


def _speed(results: dict[str, dict[str, Any]]) -> str:
    return "simulator: " + "; ".join(
        f"{s} {r['perf']['events']:,} events in {r['perf']['wall_s']:.1f}s "
        f"({r['perf']['events_per_s']:,.0f} events/s)"
        for s, r in results.items()
    )


def _experiment_file(args: Any, cal: calibration.Calibration, cfg: SimConfig, systems: list[str],
                     dest: Path, command: str, out: TextIO) -> int:  # fmt: skip
    exp = load_experiment(args.workload)
    runs: list[tuple[str, str, dict[str, Any]]] = []
    all_results: dict[str, dict[str, Any]] = {}
    for i, plan in enumerate(exp.plans()):
        pcfg, preset = plan_config(plan, cfg)
        w = plan_workload(plan, pcfg.seed)
        for s in [preset] if preset else systems:
            r = run_one(s, w, pcfg, cal, progress=not args.no_progress, until=args.until)
            runs.append((plan.label or f"plan{i}", s, r))
            all_results[f"{plan.label or f'plan{i}'} / {s}"] = r
    meta = _meta(command, cfg, {"name": exp.name, "notes": exp.objectives}, cal)
    files = report.write(dest, meta, all_results)
    table = report.md_table(PLAN_HEADER, plan_table(runs))
    with (dest / "report.md").open("a") as f:
        f.write(f"\n## Plans (latencies in ms)\n\n{table}\n")
    print(table, file=out)
    print(f"wrote {', '.join(str(p) for p in files)}", file=out)
    return 0


def _study(args: Any, cal: calibration.Calibration, dest: Path, command: str, out: TextIO) -> int:
    if args.experiment not in STUDIES:
        raise UsageError(f"--experiment: one of {', '.join(STUDIES)}")
    t0 = time.perf_counter()
    sections = STUDIES[args.experiment](
        cal, args.seed, args.quick, lambda s: print(s, file=sys.stderr, flush=True),
        not args.no_progress,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    write_study(dest, args.experiment, command, sections, wall)
    for s in sections:
        print(f"\n{s.title}\n" + report.md_table(s.header, s.rows), file=out)
    print(f"\n{args.experiment}: {wall:.0f}s wall; wrote {dest}/report.md", file=out)
    return 0


def write_study(dest: Path, name: str, command: str, sections: list[Section], wall: float) -> None:
    """report.md (tables + plots per section), results.json, perf.json."""
    dest.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Experiment: {name}",
        "",
        f"Command: `{command}`",
        "",
        f"Wall time {wall:.0f} s.",
        "",
    ]
    stable: dict[str, Any] = {}
    perf: dict[str, Any] = {}
    for i, s in enumerate(sections):
        sub = dest / f"part{i + 1}"
        sub.mkdir(exist_ok=True)
        pngs = report.plot(sub, s.runs)
        lines += [f"## {s.title}", "", report.md_table(s.header, s.rows), ""]
        if s.note:
            lines += [s.note, ""]
        lines += [f"![{p.stem}](part{i + 1}/{p.name})" for p in pngs] + [""]
        stable[s.title] = {
            k: {kk: vv for kk, vv in v.items() if kk != "perf"} for k, v in s.runs.items()
        }
        perf[s.title] = {k: v["perf"] for k, v in s.runs.items()}
    (dest / "report.md").write_text("\n".join(lines) + "\n")
    (dest / "results.json").write_text(json.dumps(stable, indent=1, sort_keys=True, default=str))
    (dest / "perf.json").write_text(json.dumps(perf, indent=1, sort_keys=True))
