"""The scaling metric choice and SLO targets: validated with the field
named, each metric's fleet value read from load signals, SLO pressure, and
the KPA fed the chosen metric scales to value / target."""

from __future__ import annotations

import pytest

from controlplane.runtime.llmsignals import Load, Sample
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.llmsignal import (
    PRESSURE_MAX,
    ScalingSignal,
    fleet_value,
    kpa_config,
    observed,
    slo_pressure,
)


def loads() -> list[Load]:
    return [
        Load("a", 0.0, Sample(waiting=3, running=5, kv_usage=0.5), tokens_per_s=900.0),
        Load("b", 0.0, Sample(waiting=0, running=2, kv_usage=0.9), tokens_per_s=300.0),
    ]


@pytest.mark.parametrize(
    ("metric", "want"),
    [("concurrency", 7.0), ("rps", 4.0), ("queue", 10.0), ("kv", 1.4), ("tokens_per_s", 1200.0)],
)
def test_fleet_value_per_metric(metric: str, want: float) -> None:
    got = fleet_value(ScalingSignal(metric), loads(), concurrency=7.0, rps=4.0)
    assert got == pytest.approx(want)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"metric": "gpu"}, "autoscaling.metric"),
        ({"metric": 3}, "autoscaling.metric"),
        ({"target": -1}, "autoscaling.target"),
        ({"target": "x"}, "autoscaling.target"),
        ({"metric": "kv", "target": 70}, "autoscaling.target"),
        ({"ttft_ms": -5}, "autoscaling.ttft_s"),
        ({"tpot_ms": 10_000_000}, "autoscaling.tpot_s"),
        ({"tpot_ms": True}, "autoscaling.tpot_ms"),
    ],
)
def test_spec_is_validated_naming_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ScalingSignal.from_spec(doc)


def test_slo_pressure() -> None:
    s = ScalingSignal.from_spec({"metric": "queue", "ttft_ms": 1000, "tpot_ms": 100})
    assert s.ttft_s == 1.0 and s.tpot_s == 0.1
    assert slo_pressure(s, 0.5, 0.05) == 1.0
    assert slo_pressure(s, 1.5, 0.05) == pytest.approx(1.5)
    assert slo_pressure(s, 0.5, 0.15) == pytest.approx(1.5)
    # A latency k times over target is a queue: at most PRESSURE_MAX.
    assert slo_pressure(s, 30.0, 0.05) == PRESSURE_MAX == 2.0
    assert slo_pressure(s, None, None) == 1.0
    assert observed(s, 10.0, 2.0, None) == pytest.approx(20.0)
    # While instances start, their wait is not a shortage: no pressure.
    assert observed(s, 10.0, 2.0, None, starting=1) == pytest.approx(10.0)
    assert slo_pressure(ScalingSignal("queue"), 99.0, 99.0) == 1.0


def test_kpa_scales_on_the_chosen_metric() -> None:
    s = ScalingSignal("tokens_per_s", target=500.0)
    cfg = kpa_config(s, KpaConfig(target_concurrency=1.0, stable_window_s=20.0, tick_s=2.0), 4)
    assert cfg.target_concurrency == 500.0
    kpa = KpaAutoscaler(cfg)
    value = fleet_value(s, loads(), concurrency=0.0, rps=0.0)
    d = None
    for t in range(0, 8, 2):
        kpa.observe(float(t), observed(s, value, None, None))
        d = kpa.decide(float(t), 1)
    assert d is not None and d.desired == 3  # 1200 tokens/s / 500 per instance
    assert ScalingSignal("concurrency").target_for(4) == 4.0
    assert ScalingSignal("queue").target_for(4) == 8.0
