"""The monitoring files under deploy/monitoring/: `promtool check rules` and
`promtool test rules` pass (real promtool, Debian package prometheus), the
dashboards are what scripts/make_dashboards.py makes, and every alert's
runbook anchor exists in docs/operations.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "deploy" / "monitoring"
RULES = MON / "galaxy-rules.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing; .ci/run installs prometheus")
        pytest.skip("needs promtool (Debian package prometheus)")
    return path


def test_promtool_check_rules() -> None:
    r = subprocess.run([_promtool(), "check", "rules", str(RULES)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_of_every_alert() -> None:
    tests = MON / "tests" / "galaxy-rules-test.yaml"
    r = subprocess.run([_promtool(), "test", "rules", tests.name], cwd=tests.parent,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # Every alert has at least one unit test that expects it to fire.
    fired = {
        t["alertname"]
        for case in yaml.safe_load(tests.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t["exp_alerts"]
    }
    assert fired == set(alerts()), f"alerts without a firing test: {set(alerts()) - fired}"


def alerts() -> dict[str, dict]:
    """Alert name -> rule."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_every_alert_has_a_runbook_section() -> None:
    doc = (REPO / "docs" / "operations.md").read_text().lower()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip("# ").lower()).replace(" ", "-")
        for h in doc.splitlines()
        if h.startswith("#")
    }
    for name, rule in alerts().items():
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"


def test_dashboards_are_what_the_generator_makes() -> None:
    r = subprocess.run([sys.executable, "scripts/make_dashboards.py", "--check"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for path in (MON / "dashboards").glob("*.json"):
        d = json.loads(path.read_text())
        assert d["uid"].startswith("galaxy-") and panel_exprs(d), path.name


def panel_exprs(dashboard: dict) -> list[str]:
    """Every PromQL expression of a dashboard's panels."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")]
