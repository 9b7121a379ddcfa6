"""The LLM scaling simulator drives the real KPA with each scaling signal on
the Azure LLM trace: every request is answered, scale-down removes only idle
instances (instance-seconds stay below keeping every started instance up),
and the SLO-pressured signal starts at least as many instances."""

from __future__ import annotations

import pytest

from controlplane.llm.profiles import profile
from functions.dispatch.admission import Admission
from functions.dispatch.autoscaling.llmsignal import ScalingSignal
from simulator.llm_scaling import CODE, CONV, azure_conv, classes, fit, run


@pytest.mark.skipif(not CONV.exists(), reason="the Azure LLM trace is not in ../shared/data")
def test_scaling_signals_on_the_azure_trace() -> None:
    jobs = azure_conv(CONV, minutes=1.0, speed=4.0)
    prof = profile("llama2-13b-a100")
    slo = (1.0, 0.1)
    conc = run(jobs, "concurrency", ScalingSignal("concurrency"), prof, 8, slo)
    sig = ScalingSignal.from_spec({"metric": "queue", "ttft_ms": 1, "tpot_ms": 1})
    queue = run(jobs, "queue", sig, prof, 8, slo)
    for o in (conc, queue):
        assert 0 < o.good <= o.requests == len(jobs)
        assert len(o.ttfts) == len(jobs)  # nothing dropped or cut
        assert o.instance_s < o.started * (o.duration_s + 120)
    # An unreachable SLO keeps pressure on: never fewer instances.
    assert queue.started >= conc.started


@pytest.mark.slow
@pytest.mark.skipif(not CODE.exists(), reason="the Azure LLM trace is not in ../shared/data")
def test_targets_are_fitted_to_the_engine_and_the_mix() -> None:
    prof = profile("llama2-13b-a100")
    slo = (1.0, 0.1)
    chat = fit(azure_conv(CONV, minutes=2.0), prof, slo, finishes=200)
    code = fit(azure_conv(CODE, minutes=2.0), prof, slo, finishes=200)
    # Code prompts are ~2k tokens with few output tokens: prefill bounds an
    # instance at far fewer requests in flight than chat.
    assert code.concurrency < chat.concurrency
    for f in (chat, code):
        assert f.queue == pytest.approx(f.concurrency)  # closed loop: always that many
        assert 0 < f.kv <= 1 and f.tokens_per_s > 0
    # A tighter TPOT target leaves room for fewer requests per instance.
    tight = fit(azure_conv(CONV, minutes=2.0), prof, (1.0, 0.025), finishes=200)
    assert tight.concurrency < chat.concurrency


@pytest.mark.skipif(not CONV.exists(), reason="the Azure LLM trace is not in ../shared/data")
def test_admission_sheds_the_lowest_class_first_in_the_simulator() -> None:
    jobs = azure_conv(CONV, minutes=4.0, speed=4.0)
    prof = profile("llama2-13b-a100")
    prios = classes(len(jobs), (0.3, 0.4, 0.3))
    sig = ScalingSignal.from_spec({"metric": "concurrency", "ttft_ms": 1000, "tpot_ms": 100})
    # Three instances at most for 4x the trace: overloaded throughout.
    o = run(jobs, "adm", sig, prof, 32, (1.0, 0.1), admission=Admission(), priorities=prios,
            max_scale=3)  # fmt: skip
    sent = {p: o.by_class[p][0] for p in (1, 0, -1)}
    assert sum(sent.values()) == o.requests == len(jobs)
    assert o.shed > 0 and o.good + o.shed <= o.requests
    # Every request answered or shed: the TTFTs are of the admitted ones.
    assert len(o.ttfts) == o.requests - o.shed
    good = {p: o.by_class[p][1] / sent[p] for p in sent}
    # Sheddable requests go first, so critical ones meet the SLO more often.
    assert good[1] > good[0] > good[-1]
