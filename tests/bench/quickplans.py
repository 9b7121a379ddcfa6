"""Running shipped bench plans in their short form (`galaxy bench --quick`)
from a test: real control planes, every scenario, the report, no process
left. The plans are split over a few test files (by family) so parallel
workers share them; smoke.yaml runs in full in test_smoke.py. Checks that
each plan runs, never its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from controlplane.bench.trace import shared_data_dir
from tests.bench.test_smoke import _alive, _leftovers

REPO = Path(__file__).resolve().parents[2]
#: Where trace-replay plans read their data sets (next to the repository).
DATA = shared_data_dir(REPO)
#: Plan runs at once: each waits mostly on process starts, not on the CPU.
AT_ONCE = 2


def shipped(*names: str) -> list[Path]:
    """The named plans of experiments/, each of which must exist."""
    plans = [REPO / "experiments" / n for n in names]
    missing = [p.name for p in plans if not p.is_file()]
    assert not missing, f"not shipped: {missing}"
    return plans


def _run(plan: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # No plots: a short run checks that the plan runs (the smoke test
        # checks the plots); drawing them is 1.6 s of CPU a plan.
        [sys.executable, "-m", "controlplane.bench", "-f", str(plan), "--quick", "--no-plots",
         "--out", str(out), "--data-dir", str(DATA)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def problems(plan: Path, out: Path, r: subprocess.CompletedProcess[str]) -> list[str]:
    """What is wrong with one short run (empty when nothing is)."""
    if r.returncode != 0:
        return [f"{plan.name}: exit {r.returncode}: {r.stderr[-3000:]}"]
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


def run_all(plans: list[Path], tmp_path: Path) -> list[str]:
    """Run the plans (AT_ONCE at a time); every problem of every run."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(lambda p: _run(p, tmp_path / p.stem), plans))
    return [
        x
        for plan, r in zip(plans, runs, strict=True)
        for x in problems(plan, tmp_path / plan.stem, r)
    ]
