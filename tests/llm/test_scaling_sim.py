"""The LLM scaling simulator drives the real KPA with each scaling signal on
the Azure LLM trace: every request is answered, scale-down removes only idle
instances (instance-seconds stay below keeping every started instance up),
and the SLO-pressured signal starts at least as many instances."""

from __future__ import annotations

import pytest

from controlplane.llm.profiles import profile
from functions.dispatch.autoscaling.llmsignal import ScalingSignal
from simulator.llm_scaling import CODE, CONV, azure_conv, fit, run


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
