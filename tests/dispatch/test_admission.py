"""Admission by SLO class (functions/dispatch/admission.py, pure): at
overload the lowest class is shed first, by predicted wait and by queue
bound; without a prediction nothing is shed on a guess; the reason names
the class and the numbers, never the request."""

from __future__ import annotations

import math

import pytest

from controlplane.runtime import sloclass
from controlplane.runtime.clock import ManualClock
from functions.dispatch.admission import Admission, shed_demand
from functions.dispatch.autoscaling.llmsignal import ScalingSignal
from functions.dispatch.llmroute import LlmRouting
from functions.dispatch.policy import FunctionRouter, Instance

CRITICAL, STANDARD, SHEDDABLE = 1, 0, -1


def decide(priority: int, queued: int, rate: float, ttft_s: float = 1.0, bound: int = 100):
    return Admission().decide(
        priority, ttft_s=ttft_s, queued=queued, first_tokens_per_s=rate, queue_bound=bound
    )


def test_the_lowest_class_is_shed_first_as_the_predicted_wait_grows() -> None:
    # 10 served/s: 5 queued is 0.5 s of wait, 20 is 2 s, 60 is 6 s.
    assert all(decide(p, 5, 10.0).admit for p in (CRITICAL, STANDARD, SHEDDABLE))
    assert [decide(p, 20, 10.0).admit for p in (CRITICAL, STANDARD, SHEDDABLE)] == [
        True, True, False,
    ]  # fmt: skip
    assert [decide(p, 60, 10.0).admit for p in (CRITICAL, STANDARD, SHEDDABLE)] == [
        True, False, False,
    ]  # fmt: skip
    v = decide(SHEDDABLE, 20, 10.0)
    assert v.reason.startswith("sheddable request shed: predicted wait 2.00s")
    assert "20 queued" in v.reason and "1.00s TTFT budget" in v.reason


def test_no_prediction_without_a_target_or_a_rate() -> None:
    assert decide(SHEDDABLE, 40, 0.0).admit  # nothing served recently: no guess
    assert decide(SHEDDABLE, 40, 10.0, ttft_s=0.0).admit  # no TTFT target
    assert Admission().budget_s(CRITICAL, 1.0) == math.inf


def test_the_queue_bound_sheds_by_class_before_it_refuses_everyone() -> None:
    # No prediction (no rate): the shares of the bound alone.
    v = decide(SHEDDABLE, 50, 0.0)
    assert not v.admit and "over 50% of the bound of 100" in v.reason
    # Standard: the bound itself, refused by the queue as before classes
    # (queue_full), not shed here.
    assert decide(STANDARD, 99, 0.0).admit and decide(STANDARD, 100, 0.0).admit
    assert decide(CRITICAL, 99, 0.0).admit
    tighter = Admission(standard_share=0.8).decide(
        STANDARD, ttft_s=1.0, queued=80, first_tokens_per_s=0.0, queue_bound=100
    )
    assert not tighter.admit and "over 80% of the bound of 100" in tighter.reason


@pytest.mark.parametrize(
    "kwargs",
    [{"standard_factor": 0.5}, {"sheddable_share": 0.0}, {"sheddable_share": 1.5}],
)
def test_bad_settings_name_the_field(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Admission(**kwargs)


def test_class_names_and_priorities() -> None:
    assert [sloclass.parse(v) for v in ("critical", " Standard", "SHEDDABLE")] == [1, 0, -1]
    assert [sloclass.class_of(p) for p in (7, 0, -3)] == ["critical", "standard", "sheddable"]
    with pytest.raises(ValueError, match="X-Galaxy-Priority: one of critical, standard"):
        sloclass.parse("urgent" * 100)


def test_shed_requests_stay_demand_for_the_autoscaler_once() -> None:
    assert shed_demand(ScalingSignal("queue"), 3.0, 4) == 7.0
    assert shed_demand(ScalingSignal("kv"), 0.3, 4) == 0.3  # no per-request unit
    clock = ManualClock()
    r = FunctionRouter("f", 8, 4, clock)
    r.add_instance(Instance("i0", "127.0.0.1:1", "node-0", 8))
    r.acquire()
    llm = LlmRouting(clock)
    sig = ScalingSignal("concurrency", ttft_s=1.0)
    llm.shed("f")
    llm.shed("f")
    assert llm.fleet(sig, r, 0.0) == 3.0  # 1 in flight + 2 shed
    assert llm.fleet(sig, r, 0.0) == 1.0  # counted in one round only
