"""Prometheus text -> histograms, deltas between scrapes, bucket quantiles."""

import math

import pytest

from controlplane.bench import promscrape as ps


def text(counts: dict[str, float], total: float, s: float) -> str:
    lines = [
        "# HELP galaxy_scheduling_latency_seconds x",
        "# TYPE galaxy_scheduling_latency_seconds histogram",
    ]
    for le, c in counts.items():
        lines.append(f'galaxy_scheduling_latency_seconds_bucket{{le="{le}"}} {c}')
    lines.append(f"galaxy_scheduling_latency_seconds_count {total}")
    lines.append(f"galaxy_scheduling_latency_seconds_sum {s}")
    lines += ["# HELP galaxy_probes_total p", "# TYPE galaxy_probes_total counter"]
    lines.append(f"galaxy_probes_total {total * 2}")
    return "\n".join(lines) + "\n"


def test_delta_and_quantiles():
    before = ps.parse(text({"0.001": 10, "0.01": 10, "+Inf": 10}, 10, 0.005))
    after = ps.parse(text({"0.001": 60, "0.01": 110, "+Inf": 110}, 110, 0.305))
    h = ps.histogram_delta([before], [after], "galaxy_scheduling_latency_seconds")
    assert h.count == 100
    # 50 of 100 in (0, 1 ms], 50 in (1, 10 ms]: the median is at 1 ms.
    assert h.quantile(0.5) == pytest.approx(0.001)
    assert h.quantile(0.75) == pytest.approx(0.0055)
    s = h.summary_ms()
    assert s["count"] == 100 and s["mean"] == pytest.approx(3.0)
    assert ps.counter_delta([before], [after], "galaxy_probes_total") == 200


def test_empty_and_overflow():
    assert math.isnan(ps.Histogram().quantile(0.99))
    h = ps.Histogram({0.01: 0, math.inf: 5}, 1.0, 5)
    assert h.quantile(0.99) == 0.01  # beyond the last finite bucket: its bound


def test_labelled_histograms_are_kept_apart_and_summed():
    lines = ["# HELP galaxy_gc_pause_seconds g", "# TYPE galaxy_gc_pause_seconds histogram"]
    for gen, n, fast, total in (("0", 90, 90, 0.009), ("2", 10, 0, 0.05)):
        lines += [
            f'galaxy_gc_pause_seconds_bucket{{generation="{gen}",le="0.001"}} {fast}',
            f'galaxy_gc_pause_seconds_bucket{{generation="{gen}",le="0.01"}} {n}',
            f'galaxy_gc_pause_seconds_bucket{{generation="{gen}",le="+Inf"}} {n}',
            f'galaxy_gc_pause_seconds_count{{generation="{gen}"}} {n}',
            f'galaxy_gc_pause_seconds_sum{{generation="{gen}"}} {total}',
        ]
    scr = ps.parse("\n".join(lines) + "\n")
    assert scr.histograms["galaxy_gc_pause_seconds"].count == 100
    full = scr.histograms["galaxy_gc_pause_seconds{generation=2}"]
    assert (full.count, full.sum, full.buckets[0.001]) == (10, 0.05, 0)
