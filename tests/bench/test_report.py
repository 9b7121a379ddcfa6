"""Plan summaries, results.json, report.md and plots from synthetic runs."""

import json
import math

import pytest

from controlplane.bench import promscrape as ps
from controlplane.bench import report, summary
from tests.bench import fakes


def test_summary_counts_add_up_and_ratios_are_to_echo():
    p = fakes.plan_result()
    r = p["requests"]
    assert r["ok"] + r["errors"] == r["measured"] == 10
    assert r["warm"] + r["cold"] == r["ok"] and r["cold"] == 3
    assert p["latency_ms"]["cold_start"]["count"] == 3
    assert p["latency_ms"]["warm_dispatch"]["count"] == 6
    assert p["latency_ms"]["scheduling"]["count"] == 3
    t, q = p["throughput"], p["ratio_to_echo"]
    assert math.isclose(t["requests_per_s"], 18.0) and math.isclose(t["instances_per_s"], 6.0)
    echo = p["baseline"]["echo"]["requests_per_s"]
    assert math.isclose(echo, 900.0)
    for k in ("requests_per_s", "rpcs_per_s", "instances_per_s", "placements_per_s"):
        assert math.isclose(q[k], t[k] / echo)
    assert p["errors_by_code"] == {"DEADLINE_EXCEEDED": 1}


@pytest.mark.slow
def test_write_all(tmp_path):
    res = fakes.results()
    paths = report.write_all(res, tmp_path)
    names = {p.name for p in paths}
    assert {"results.json", "samples.json", "report.md"} <= names
    for png in ("latency_cdf.png", "throughput.png", "timeline.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Strict JSON: NaN (e.g. an unknowable stddev) became null.
    doc = json.loads((tmp_path / "results.json").read_text(), parse_constant=_reject)
    assert doc["plans"][0]["latency_ms"]["scheduling"]["stddev"] is None
    assert "_samples" not in doc["plans"][0]
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert len(samples["0"]["lat_ms"]) == doc["plans"][0]["requests"]["ok"]
    md = (tmp_path / "report.md").read_text()
    for text in ("## Throughput", "x echo", "## Latency", "## CPU cores", "boom"):
        assert text in md
    assert "![throughput.png](throughput.png)" in md


def _reject(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def _gc_scrape(young: int, full: int) -> ps.Scrape:
    lines = ["# TYPE galaxy_gc_pause_seconds histogram"]
    for gen, n, le in (("0", young, "0.0005"), ("2", full, "0.025")):
        lines += [
            f'galaxy_gc_pause_seconds_bucket{{generation="{gen}",le="{le}"}} {n}',
            f'galaxy_gc_pause_seconds_bucket{{generation="{gen}",le="+Inf"}} {n}',
            f'galaxy_gc_pause_seconds_count{{generation="{gen}"}} {n}',
            f'galaxy_gc_pause_seconds_sum{{generation="{gen}"}} {n * float(le) / 2}',
        ]
    return ps.parse("\n".join(lines) + "\n")


def test_gc_pauses_and_cpu_waits_are_reported():
    p = fakes.plan_result()
    scr = {"d0": [_gc_scrape(10, 1)], "d1": [_gc_scrape(60, 3)]}
    p["gc_pauses"] = summary.gc_pauses(scr)
    full = p["gc_pauses"]["dispatch"]["full"]
    assert full["count"] == 2 and full["max_bucket_s"] == 0.025
    assert math.isclose(full["sum_s"], 0.025)
    assert p["gc_pauses"]["dispatch"]["count"] == 52
    p["run_queue_wait"] = {"dispatch-0": 0.25, "load_generator": 0.125}
    res = fakes.results(1)
    res["plans"] = [p]
    md = report.markdown(res)
    assert "## Garbage-collector pauses" in md and "| dispatch | 52 |" in md
    assert "## Waiting for a CPU" in md and "| 0.250 | 0.125 |" in md
