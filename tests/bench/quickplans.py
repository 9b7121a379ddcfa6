"""Running shipped bench plans in their short form (`galaxy bench --quick`)
from a test: real control planes, every scenario, the report, no process
left. Checks that each plan runs, never its figures.

The runs are in this process, one after another, on control planes kept up
across the plans (``controlplane.bench.planes.ControlPlanes``): the short
forms of most plans resolve to the same configuration, and starting a control
plane for each was most of their cost. The bench command as a process, its
plots and a plan's own control plane are checked by tests/bench/test_smoke.py
on smoke.yaml, run in full."""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.bench import plan as pl
from controlplane.bench import report
from controlplane.bench.planes import ControlPlanes
from controlplane.bench.runner import RunOptions, run_bench
from controlplane.bench.trace import shared_data_dir
from tests.bench.test_smoke import _alive, _leftovers

REPO = Path(__file__).resolve().parents[2]
#: Where trace-replay plans read their data sets (next to the repository).
DATA = shared_data_dir(REPO)


def shipped(*names: str) -> list[Path]:
    """The named plans of experiments/, each of which must exist."""
    plans = [REPO / "experiments" / n for n in names]
    missing = [p.name for p in plans if not p.is_file()]
    assert not missing, f"not shipped: {missing}"
    return plans


async def _run(plan: Path, out: Path, planes: ControlPlanes, tag: str) -> str | None:
    """One short run, its files written as `galaxy bench --quick --no-plots`
    writes them; the error that stopped it, if one did."""
    try:
        bf = pl.load_file(plan, quick=True)
        opts = RunOptions(
            out=out, data_dir=DATA, settle=False, planes=planes, tag=tag, log=lambda s: None
        )
        # No plots: a short run checks that the plan runs (the smoke test
        # checks the plots); drawing them is 1.6 s of CPU a plan.
        report.write_all(await run_bench(bf, opts), out, plots=False)
    except Exception:  # one plan's error must not hide the others' results
        return f"{plan.name}: {traceback.format_exc()[-3000:]}"
    return None


def problems(plan: Path, out: Path) -> list[str]:
    """What is wrong with one short run that ran to the end (empty when
    nothing is), read after every control plane stopped."""
    doc = json.loads((out / "results.json").read_text())
    found = []
    if doc["failures"]:
        found.append(f"{plan.name}: failures {doc['failures']}")
    # One configuration: each scenario of the file once, in order.
    scenarios = [s["name"] for s in yaml.safe_load(plan.read_text())["scenarios"]]
    if [p["scenario"] for p in doc["plans"]] != scenarios:
        found.append(f"{plan.name}: scenarios {[p['scenario'] for p in doc['plans']]}")
    for p in doc["plans"]:
        req = p["requests"]
        if not (req["ok"] + req["errors"] == req["measured"] and req["ok"] > 0):
            found.append(f"{plan.name}: requests {req}")
        if p["config"]["nodes"] > 4:  # the short form's node bound
            found.append(f"{plan.name}: {p['config']['nodes']} nodes")
    if doc["plots"] or list(out.glob("*.png")):  # --no-plots
        found.append(f"{plan.name}: plots drawn: {doc['plots']}")
    if f"# Bench: {doc['experiment']}" not in (out / "report.md").read_text():
        found.append(f"{plan.name}: report.md has no title")
    if [pid for pid in doc["pids"] if _alive(pid)] or _leftovers(str(out)):
        found.append(f"{plan.name}: processes left")
    return found


@dataclass
class QuickRuns:
    """What one run of the short forms found."""

    #: Every problem of each plan, by plan file name (empty: it ran well).
    problems: dict[str, list[str]]
    #: Control planes started for them all.
    planes: int
    #: Functions a shared control plane still held after each plan's run.
    left_after: dict[str, list[str]]


async def run_all(plans: list[Path], tmp_path: Path) -> QuickRuns:
    """Run the plans on shared control planes; what went wrong with each (a
    process left by the shared control planes counts against every plan)."""
    planes = ControlPlanes(tmp_path / "planes", log=lambda s: None)
    errors: dict[str, str | None] = {}
    left_after: dict[str, list[str]] = {}
    try:
        for i, plan in enumerate(plans):
            errors[plan.name] = await _run(plan, tmp_path / plan.stem, planes, f"q{i}-")
            left_after[plan.name] = await planes.functions()
    finally:
        await planes.close()
    left = _leftovers(str(tmp_path / "planes"))
    found: dict[str, list[str]] = {}
    for plan in plans:
        error = errors[plan.name]
        found[plan.name] = [error] if error else problems(plan, tmp_path / plan.stem)
        if left:
            found[plan.name].append(f"{plan.name}: shared control plane processes left: {left}")
    return QuickRuns(found, planes.started, left_after)
