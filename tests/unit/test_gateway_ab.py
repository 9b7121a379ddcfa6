"""The interleaved A/B of two clusters through their gateways
(controlplane/bench/gateway_ab.py): the order flips every pair, and the
summary pairs each run with its partner and takes medians over pairs."""

from __future__ import annotations

import pytest

from controlplane.bench.gateway_ab import _label_value, order, summarize


def _run(pair: int, c: int, cluster: str, rps: float, p50: float, node: float) -> dict[str, object]:
    path = {
        "requests_per_s": rps,
        "p50_ms": p50,
        "node_cpu_us_per_request": node,
        "agent_cpu_us_per_request": node / 2,
        "proxy_cpu_us_per_request": 300.0,
        "client_cpu_us_per_request": 100.0,
    }
    return {"pair": pair, "concurrency": c, "cluster": cluster, "modes": {"gateway_cache": path}}


def test_the_order_flips_every_pair() -> None:
    assert [order(i, ["a", "b"]) for i in range(4)] == [["a", "b"], ["b", "a"]] * 2


def test_three_clusters_take_turns_first() -> None:
    got = [order(i, ["a", "b", "c"]) for i in range(3)]
    assert got == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


def test_each_pair_is_compared_and_medians_are_over_pairs() -> None:
    runs = [
        _run(0, 1, "process", 1000, 0.60, 120),
        _run(0, 1, "bwrap", 900, 0.70, 180),
        _run(1, 1, "bwrap", 400, 1.10, 200),  # this pair's order flipped
        _run(1, 1, "process", 800, 0.80, 130),
        _run(2, 1, "process", 1000, 0.50, 110),
        _run(2, 1, "bwrap", 1000, 0.55, 150),
        _run(0, 8, "process", 2000, 2.0, 100),
        _run(0, 8, "bwrap", 1500, 2.5, 160),
    ]
    out = summarize(runs, "process", "bwrap")
    c1 = out["concurrency_1"]
    assert isinstance(c1, dict)
    assert [r["throughput_change_pct"] for r in c1["pairs"]] == [-10.0, -50.0, 0.0]
    assert [r["added_p50_ms"] for r in c1["pairs"]] == [0.1, 0.3, 0.05]
    assert [r["added_node_cpu_us"] for r in c1["pairs"]] == [60, 70, 40]
    assert c1["median_throughput_change_pct"] == -10.0
    assert c1["median_added_p50_ms"] == 0.1
    assert c1["median_added_node_cpu_us"] == 60
    # 520 µs against 580: where every core is busy, 520/580 - 1 = -10.3%.
    assert c1["pairs"][0]["cpu_bound_throughput_change_pct"] == -10.3
    assert c1["median_cpu_bound_throughput_change_pct"] == -10.3
    assert c1["median_process_node_cpu_us"] == 120
    assert c1["median_bwrap_node_cpu_us"] == 180
    c8 = out["concurrency_8"]
    assert isinstance(c8, dict)
    assert c8["median_throughput_change_pct"] == -25.0


def test_a_pair_cut_short_is_left_out() -> None:
    runs = [_run(0, 1, "process", 1000, 0.6, 120), _run(0, 1, "bwrap", 900, 0.7, 180)]
    runs.append(_run(1, 1, "bwrap", 10, 9.0, 900))  # its partner never ran
    c1 = summarize(runs, "process", "bwrap")["concurrency_1"]
    assert isinstance(c1, dict)
    assert [r["pair"] for r in c1["pairs"]] == [0]


@pytest.mark.parametrize("text", ["bwrap", "=dir", "bwrap="])
def test_a_cluster_without_label_and_value_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(SystemExit, match="--cluster: LABEL=VALUE"):
        _label_value(text, "--cluster")
