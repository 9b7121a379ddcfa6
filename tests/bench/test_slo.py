"""SLO grammar and checks against plan results."""

import math

import pytest

from controlplane.bench import slo

PLAN = {
    "latency_ms": {
        "warm_dispatch": {"count": 10, "p99": 4.0, "mean": 2.0},
        "cold_start": {"count": 5, "p99": 60.0},
        "scheduling": {"count": 0, "p99": math.nan},
    },
    "throughput": {"requests_per_s": 1000.0, "instances_per_s": 300.0},
    "ratio_to_echo": {"requests_per_s": 0.5, "warm_p99": 1.6},
    "requests": {"measured": 100, "errors": 2},
}


def test_parse_units_and_several_objectives():
    objs = slo.parse("p99_cold_start<0.05s, p99_dispatch<=5ms,mean_scheduling<900us")
    assert [o.metric for o in objs] == ["p99_cold_start", "p99_dispatch", "mean_scheduling"]
    assert [o.value for o in objs] == pytest.approx([50.0, 5.0, 0.9])
    assert slo.parse("error_rate<1%")[0].value == pytest.approx(0.01)
    assert slo.parse("instances_per_s>=2500/s")[0].value == 2500


def test_checks_against_a_plan():
    cold, disp, sched, ratio, err = slo.parse(
        "p99_cold_start<50ms,p99_dispatch<5ms,p99_scheduling<10ms,"
        "ratio_requests_per_s>=0.85,error_rate<5%"
    )
    assert cold.check(PLAN) == (60.0, False)
    assert disp.check(PLAN) == (4.0, True)
    value, met = sched.check(PLAN)
    assert math.isnan(value) and met is None  # not measured is not "missed"
    assert ratio.check(PLAN) == (0.5, False)
    assert err.check(PLAN) == (0.02, True)


def test_the_warm_tail_against_the_same_rate_echo():
    (tail,) = slo.parse("ratio_warm_p99<1.5x")
    assert tail.check(PLAN) == (1.6, False)
    (missing,) = slo.parse("ratio_warm_p99<2")
    value, met = missing.check({"ratio_to_echo": {}})  # a closed-loop plan
    assert math.isnan(value) and met is None


@pytest.mark.parametrize(
    "bad",
    [
        "ratio_cold_p99<2",
        "p99_cold_start",
        "p98_cold_start<5ms",
        "p99_foo<5ms",
        "p99_dispatch<5kg",
        "",
    ],
)
def test_bad_objectives_say_what_is_expected(bad):
    with pytest.raises(slo.SloError, match=r"objective|no objective"):
        slo.parse(bad)


def test_parse_rate():
    assert slo.parse_rate("2000/s") == 2000.0
    assert slo.parse_rate("150") == 150.0
    with pytest.raises(slo.SloError):
        slo.parse_rate("fast")
    with pytest.raises(slo.SloError):
        slo.parse_rate("0/s")
