"""The ``bench`` sub-command.

    galaxy bench -f experiments/warm-dispatch.yaml --out results/warm
    galaxy bench --recommend --slo 'p99_cold_start<50ms' --load 2000/s --out results/rec

Also runnable without the main CLI: ``python -m controlplane.bench ...``.
Kept free of heavy imports at module load: the main CLI imports it to
register the sub-command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench flags."""
    p.add_argument(
        "-f", "--file", help="bench experiment file (YAML), e.g. experiments/cold-burst.yaml"
    )
    p.add_argument("--out", required=True, help="directory for results.json, report.md and plots")
    p.add_argument(
        "--profile",
        action="store_true",
        help="record py-spy profiles of Dispatch, Schedule, node agents and the load "
        "generator during each measured phase (needs py-spy)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the plan's short form: at most 4 nodes, 2 configurations per swept "
        "parameter and 40 requests per scenario; checks that it runs, not its figures",
    )
    p.add_argument(
        "--no-plots",
        action="store_true",
        help="skip the PNG plots (results.json, samples.json and report.md still written)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where trace samples live (default: <repo>/../shared/data)",
    )
    g = p.add_argument_group("recommend")
    g.add_argument(
        "--recommend",
        action="store_true",
        help="find the cheapest instance counts and caches that meet --slo at --load",
    )
    g.add_argument("--slo", help="objectives, e.g. 'p99_cold_start<50ms' (comma-separated)")
    g.add_argument("--load", help="offered load, e.g. 2000/s")
    g.add_argument(
        "--max-per-kind", type=int, default=3, help="instances per control function to try (3)"
    )
    g.add_argument(
        "--max-trials", type=int, default=12, help="control planes to start at most (12)"
    )
    g.add_argument("--duration", type=float, default=3.0, help="seconds of load per trial (3)")


def add_subparser(sub: Any) -> None:
    """Register ``bench`` on the main CLI's sub-parsers."""
    p = sub.add_parser("bench", help="benchmark the control plane (experiments/*.yaml)")
    add_arguments(p)
    p.set_defaults(func=cmd_bench)


def _model_plan(path: str, kind: str = "models") -> dict[str, Any] | None:
    """The plan of a bench file of a kind with its own format (``models``: the
    model cold start, controlplane.bench.models; ``batching``:
    controlplane.bench.batching), else None; exits 2 naming a bad field."""
    import importlib

    import yaml

    module = importlib.import_module(f"controlplane.bench.{kind}")

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # the ordinary loader reports the error
    try:
        plan: dict[str, Any] | None = module.load_plan(doc)
        return plan
    except ValueError as e:
        print(f"galaxy bench: {path}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


async def cmd_bench(args: argparse.Namespace) -> int:
    """Run a bench file or a recommendation search; returns the exit code."""
    from controlplane.bench import plan as pl
    from controlplane.bench import profile, recommend, report, runner, slo
    from controlplane.bench.llm import is_llm_file as llm_file
    from controlplane.bench.trace import TraceError, shared_data_dir

    out = Path(args.out)
    data_dir = Path(args.data_dir) if args.data_dir else shared_data_dir(REPO)
    if args.profile and not profile.available():
        print("galaxy bench: --profile needs py-spy (pip install py-spy)", file=sys.stderr)
        return 2
    if args.file and llm_file(args.file):  # kind: llm (controlplane/bench/llm.py)
        from controlplane.bench.llmcli import cmd_llm

        return await cmd_llm(args, out, data_dir)
    if args.file and (model_plan := _model_plan(args.file)) is not None:
        from controlplane.bench import models

        return await models.run_plan(model_plan, out)
    if args.file and (batch_plan := _model_plan(args.file, "batching")) is not None:
        from controlplane.bench import batching

        return await batching.run_plan(batch_plan, out)
    opts = runner.RunOptions(
        out=out, data_dir=data_dir, profile=args.profile, settle=not args.quick
    )
    try:
        bf = pl.load_file(args.file, quick=args.quick) if args.file else None
        if args.recommend:
            if not args.slo or not args.load:
                raise slo.SloError("--recommend needs --slo and --load")
            objectives = slo.parse(args.slo)
            load = slo.parse_rate(args.load)
            doc = await recommend.recommend(
                bf,
                objectives,
                load,
                opts,
                max_per_kind=args.max_per_kind,
                max_trials=args.max_trials,
                duration_s=args.duration,
            )
            out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local, instant
            (out / "recommend.json").write_text(json.dumps(report.clean(doc), indent=2) + "\n")
            text = recommend.render(doc)
            (out / "recommend.md").write_text(text)
            print(text)
            return 0 if doc["recommendation"] is not None else 1
        if bf is None:
            raise pl.BenchFileError("-f FILE is required (or --recommend)")
        results = await runner.run_bench(bf, opts)
    except (pl.BenchFileError, slo.SloError, TraceError) as e:
        print(f"galaxy bench: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # e.g. the echo server or etcd would not start
        print(f"galaxy bench: {e}", file=sys.stderr)
        return 1
    paths = report.write_all(results, out, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    if results["failures"]:
        print(
            f"{len(results['failures'])} plan(s) failed; see {out / 'report.md'}", file=sys.stderr
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m controlplane.bench``: the bench without the main CLI."""
    import logging

    from controlplane.runtime.host import install_uvloop

    p = argparse.ArgumentParser(prog="galaxy bench", description=__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_uvloop()
    try:
        return asyncio.run(cmd_bench(args))
    except KeyboardInterrupt:
        return 130
