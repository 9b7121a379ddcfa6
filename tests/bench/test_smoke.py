"""CI smoke: `galaxy bench` on experiments/smoke.yaml end to end with real
processes. Checks the report is right and complete, never how fast it is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.bench import cli

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _leftovers(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(p.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke"
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.bench", "-f", "experiments/smoke.yaml", "--out", out],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.slow  # the module fixture runs `galaxy bench` (~20 s)
def test_files(smoke):
    for name in ("results.json", "samples.json", "report.md"):
        assert (smoke / name).stat().st_size > 0
    for png in ("latency_cdf.png", "throughput.png", "timeline.png"):
        assert (smoke / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # the module fixture runs `galaxy bench` (~20 s)
def test_results_schema_and_counts(smoke):
    doc = json.loads((smoke / "results.json").read_text())
    assert doc["schema"] == "galaxy-bench/1" and doc["failures"] == []
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["python"]
    plans = doc["plans"]
    assert [p["scenario"] for p in plans] == ["warm-max", "mixed", "half"]
    for p in plans:
        r = p["requests"]
        assert r["ok"] + r["errors"] == r["measured"] > 0
        assert r["warm"] + r["cold"] == r["ok"]
        assert (
            r["measured"] + p["load"]["warmup_requests"] + r["not_sent"]
            == (p["load"]["total_requests"])
        )
        lat = p["latency_ms"]
        assert lat["warm_dispatch"]["count"] == r["warm"]
        assert lat["cold_start"]["count"] == r["cold"]
        for s in ("count", "mean", "stddev", "p50", "p90", "p95", "p99"):
            assert s in lat["warm_dispatch"]
        assert p["baseline"]["echo"]["requests_per_s"] > 0
        for k in ("requests_per_s", "rpcs_per_s", "instances_per_s", "placements_per_s"):
            assert k in p["throughput"] and k in p["ratio_to_echo"]
        assert p["ratio_to_echo"]["requests_per_s"] > 0
        assert {o["objective"] for o in p["objectives"]} == {
            "p99_cold_start<5s",
            "ratio_requests_per_s>0",
        }
        assert p["cpu_cores"]["load_generator"] >= 0
    # Open-loop plans also send the raw echo their own schedule: as many
    # measured requests, and the warm tail's ratio to that floor.
    assert "echo_same_rate" not in plans[0]["baseline"]  # closed loop
    for p in plans[1:]:
        same = p["baseline"]["echo_same_rate"]
        assert same["latency_ms"]["count"] + same["errors"] == p["requests"]["measured"]
        assert same["latency_ms"]["p99"] >= same["latency_ms"]["p50"] > 0
        assert p["ratio_to_echo"]["warm_p99"] == pytest.approx(
            p["latency_ms"]["warm_dispatch"]["p99"] / same["latency_ms"]["p99"]
        )
    mixed = plans[1]
    assert mixed["requests"]["cold"] > 0  # a cold share was asked for
    # Every cold start was a placement by Schedule (read from /metrics).
    assert mixed["latency_ms"]["scheduling"]["count"] >= mixed["requests"]["cold"]
    assert plans[2]["load"]["arrival_rate"] == pytest.approx(
        0.1 * plans[0]["throughput"]["requests_per_s"]
    )
    samples = json.loads((smoke / "samples.json").read_text())
    assert [len(samples[str(i)]["lat_ms"]) for i in range(3)] == [
        p["requests"]["ok"] for p in plans
    ]


@pytest.mark.slow  # the module fixture runs `galaxy bench` (~20 s)
def test_report_and_no_processes_left(smoke):
    md = (smoke / "report.md").read_text()
    heads = ("# Bench: smoke", "## Throughput", "x echo", "## Objectives", "mixed")
    for text in (*heads, "echo at the same rate"):
        assert text in md
    assert _leftovers(str(smoke)) == []
    doc = json.loads((smoke / "results.json").read_text())
    assert len(doc["pids"]) == 6  # echo, controller, 3 control functions, 1 agent
    assert [p for p in doc["pids"] if _alive(p)] == []


def test_cli_registers_bench():
    import argparse

    p = argparse.ArgumentParser()
    cli.add_subparser(p.add_subparsers(dest="command"))
    args = p.parse_args(["bench", "-f", "x.yaml", "--out", "o", "--profile"])
    assert args.func is cli.cmd_bench and args.profile and args.file == "x.yaml"


@pytest.mark.slow
def test_bad_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenarios: [{total_requests: 0}]\n")
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.bench", "-f", str(bad), "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "total_requests" in r.stderr and "Traceback" not in r.stderr
