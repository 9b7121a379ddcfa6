"""`galaxy simulate` end to end: files, reproducibility, experiment files."""

import argparse
import asyncio
import json

import pytest

from simulator import cli

PNG = b"\x89PNG\r\n\x1a\n"


def run(*argv: str) -> int:
    p = argparse.ArgumentParser(prog="galaxy")
    cli.add_subparser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(list(argv))
    return asyncio.run(args.func(args))


def test_subcommands_are_registered():
    p = argparse.ArgumentParser(prog="galaxy")
    sub = p.add_subparsers(dest="command", required=True)
    cli.add_subparser(sub)
    assert {"simulate", "simulate-fidelity", "simulate-calibrate"} <= set(sub.choices)


@pytest.mark.slow
def test_simulate_writes_report_results_and_pngs(tmp_path, capsys):
    out = tmp_path / "run"
    systems = "galaxy,knative,sparrow,ray,atoll"
    rc = run(
        "simulate", "--nodes", "30", "--workload", "poisson:rate=50,duration=10",
        "--systems", systems, "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "sched p99 ms" in printed and "events/s" in printed
    for name in ("report.md", "results.json", "perf.json"):
        assert (out / name).stat().st_size > 0
    for name in ("latency_cdf.png", "throughput.png", "control_instances.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    res = json.loads((out / "results.json").read_text())
    assert set(res["systems"]) == {"galaxy", "knative", "sparrow", "ray", "atoll"}
    g = res["systems"]["galaxy"]
    assert {"count", "mean", "stddev", "p50", "p90", "p95", "p99"} <= set(g["scheduling_latency_s"])
    assert "latency_cdf.png" in (out / "report.md").read_text()


@pytest.mark.slow
def test_same_seed_gives_identical_results_json(tmp_path):
    files = []
    for i, seed in enumerate(("7", "7", "8")):
        out = tmp_path / f"r{i}"
        run(
            "simulate", "--nodes", "20", "--workload", "bursty:duration=60,trough=2",
            "--systems", "galaxy,sparrow", "--seed", seed, "--out", str(out), "--no-progress",
        )  # fmt: skip
        files.append((out / "results.json").read_bytes())
    assert files[0] == files[1]
    assert files[0] != files[2]


# Simulates every plan of an experiment file: 2 s alone, 5.9 s among four
# workers (2026-11-29), over the fast tier's bound.
@pytest.mark.slow
def test_experiment_file_reports_each_plan(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "scenarios:\n"
        "  - name: burst\n"
        "    total_requests: 300\n"
        "    warmup_requests: 30\n"
        "    cold_fraction: 0.2\n"
        "    request_profile: {distribution: Poisson, arrival_rate: 50}\n"
        "parameters:\n"
        "  - {name: schedule_instances, value: [1, 2]}\n"
    )
    out = tmp_path / "e"
    assert run("simulate", "--nodes", "20", "--workload", str(exp), "--systems", "galaxy",
               "--out", str(out), "--no-progress") == 0  # fmt: skip
    text = (out / "report.md").read_text()
    for label in ("burst schedule_instances=1", "burst schedule_instances=2"):
        assert label in text
    assert "| p50 | p90 | p95 | p99 |" in text
    res = json.loads((out / "results.json").read_text())["systems"]
    plan = res["burst schedule_instances=2 / galaxy"]
    assert plan["params"]["instances"] == 2
    assert plan["dispatch_latency_s"]["count"] == 270  # warmup not counted


def test_bad_arguments_are_clear(tmp_path, capsys):
    assert run("simulate", "--workload", "zipf", "--out", str(tmp_path)) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert run("simulate", "--workload", "poisson", "--systems", "borg", "--out",
               str(tmp_path)) == 2  # fmt: skip
    assert "borg" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ablation"])
def test_a_documented_experiment_runs_quick(tmp_path, name, capsys):
    assert run("simulate", "--experiment", name, "--quick", "--out", str(tmp_path),
               "--no-progress") == 0  # fmt: skip
    assert "G1" in (tmp_path / "report.md").read_text()
