"""Recent TTFT/TPOT from latency histograms (controlplane/runtime/llmlatency.py):
vLLM's histograms parsed from a real /metrics page, percentiles of the
difference between scrapes over a window (manual clock), restarts, and the
SLO pressure Dispatch's autoscaler observes from them."""

from __future__ import annotations

import dataclasses
import math

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from controlplane.llm.engine import Engine, Request
from controlplane.llm.profiles import profile
from controlplane.llm.server import LlmServer
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.llmlatency import (
    TTFT_BUCKETS,
    LatencyWindow,
    quantile,
)
from controlplane.runtime.llmlatency import Histogram as Counts
from controlplane.runtime.llmsignals import Sample, SignalError, parse, scrape
from functions.dispatch.autoscale import FunctionAutoscaling
from functions.dispatch.autoscaling.llmsignal import PRESSURE_MAX, ScalingSignal, observed
from functions.dispatch.autoscaling.settings import AutoscaleSettings
from functions.dispatch.llmroute import LlmRouting
from functions.dispatch.policy import FunctionRouter, Instance
from galaxy.v1 import common_pb2


def page(ttft: list[float], tpot: list[float], tpot_name: str) -> str:
    reg = CollectorRegistry()
    a = Histogram("vllm:time_to_first_token_seconds", "", ["model_name"], registry=reg,
                  buckets=(0.1, 1.0, 10.0))  # fmt: skip
    b = Histogram(tpot_name, "", ["model_name"], registry=reg, buckets=(0.05, 0.2))
    for k, v in enumerate(ttft):
        a.labels(f"m{k % 2}").observe(v)  # two models: their buckets add up
    for v in tpot:
        b.labels("m").observe(v)
    return generate_latest(reg).decode()


@pytest.mark.parametrize(
    "tpot_name",
    [
        "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
    ],
)
def test_parse_reads_both_histograms_summing_models(tpot_name: str) -> None:
    s = parse(page([0.05, 0.5, 0.7, 20.0], [0.03, 0.1], tpot_name))
    assert s.ttft == ((0.1, 1.0), (1.0, 3.0), (10.0, 3.0), (math.inf, 4.0))
    assert s.tpot == ((0.05, 1.0), (0.2, 2.0), (math.inf, 2.0))


def test_parse_without_histograms_and_with_a_bad_bound() -> None:
    assert parse("vllm:num_requests_waiting 3\n").ttft is None
    bad = 'vllm:time_to_first_token_seconds_bucket{le="soon"} 1\n'
    with pytest.raises(SignalError, match="le 'soon' is not a number"):
        parse(bad)


def test_quantile_interpolates_as_prometheus() -> None:
    # 10 observations: 4 in (0, 1], 6 in (1, 3]. p90 is rank 9: 5/6 into (1, 3].
    assert quantile(0.9, {1.0: 4, 3.0: 10, math.inf: 10}) == pytest.approx(1 + 2 * 5 / 6)
    assert quantile(0.5, {1.0: 10, math.inf: 10}) == pytest.approx(0.5)
    # Ranks in +Inf: the largest finite bound, as histogram_quantile answers.
    assert quantile(0.9, {1.0: 1, math.inf: 10}) == 1.0
    assert quantile(0.9, {1.0: 0, math.inf: 0}) is None


def cum(values: list[float]) -> tuple[tuple[float, float], ...]:
    h = Counts(TTFT_BUCKETS)
    for v in values:
        h.observe(v)
    return h.cumulative()


def test_the_window_reads_only_what_changed_recently() -> None:
    w = LatencyWindow(window_s=10.0)
    old = [5.0] * 50  # slow requests before the first scrape: not recent
    w.observe("a", cum(old), None, now=0.0)
    assert w.latency(0.0).ttft_s is None  # a baseline only
    w.observe("a", cum(old + [0.05] * 20), None, now=2.0)
    w.observe("b", cum([0.05] * 5), None, now=2.0)  # b's baseline
    lat = w.latency(2.0)
    assert lat.ttft_s is not None and lat.ttft_s <= 0.06
    assert lat.first_tokens_per_s == pytest.approx(20 / 2.0)
    # b's slow first tokens now dominate the fleet's p90
    w.observe("b", cum([0.05] * 5 + [3.0] * 30), None, now=4.0)
    assert 2.5 < (w.latency(4.0).ttft_s or 0) <= 5.0
    # ...until they age out of the window
    w.observe("a", cum(old + [0.05] * 21), None, now=14.5)
    assert (w.latency(14.5).ttft_s or 0) <= 0.06
    assert w.latency(30.0).ttft_s is None


def test_a_restarted_instance_counts_from_zero() -> None:
    w = LatencyWindow(window_s=10.0)
    w.observe("a", cum([0.05] * 100), None, now=0.0)
    w.observe("a", cum([2.0] * 3), None, now=1.0)  # counts went down: a new process
    lat = w.latency(1.0)
    assert lat.ttft_s is not None and 1.0 < lat.ttft_s <= 2.5
    assert lat.first_tokens_per_s == pytest.approx(3.0)


def test_the_window_is_bounded() -> None:
    w = LatencyWindow(window_s=1e9, max_entries=8)
    for k in range(100):
        w.observe("a", cum([0.05] * k), None, now=float(k))
    assert w.latency(100.0).first_tokens_per_s == pytest.approx(8 / 100.0)


def test_pressure_needs_a_queue_for_ttft_but_not_for_tpot() -> None:
    sig = ScalingSignal("queue", 8.0, ttft_s=1.0, tpot_s=0.1)
    assert observed(sig, 10.0, 1.5, None, waiting=5) == 15.0
    assert observed(sig, 10.0, 1.5, None, waiting=0) == 10.0  # prefill, not a shortage
    assert observed(sig, 10.0, 1.5, 0.15, waiting=0) == pytest.approx(15.0)
    assert observed(sig, 10.0, 1.5, 0.15, starting=1, waiting=5) == 10.0
    # A latency far over target is a queue: at most PRESSURE_MAX times the value.
    assert observed(sig, 10.0, 30.0, None, waiting=5) == 10.0 * PRESSURE_MAX


async def test_the_emulated_server_exports_ttft_at_the_first_token() -> None:
    prof = dataclasses.replace(profile("smollm2-135m-cpu"), load_s=0.0)
    server = LlmServer(Engine(prof), "tiny")
    async with TestServer(server.app()) as ts:
        import asyncio

        import aiohttp

        loop = asyncio.create_task(server.run())
        req = Request("r", 40, 4000, arrived=server.clock())
        done = asyncio.create_task(server.complete_one(req))
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(200):  # until its first token is out (well before the 4000th)
                    sample = await scrape(s, str(ts.make_url("/metrics")))
                    if sample.ttft is not None and sample.ttft[-1][1] >= 1:
                        break
                    await asyncio.sleep(0.01)
            assert sample.ttft is not None and sample.ttft[-1][1] == 1
            assert not done.done()  # still generating: TTFT did not wait for the end
        finally:
            done.cancel()
            loop.cancel()


def test_dispatch_observes_slo_pressure_from_scraped_histograms() -> None:
    clock = ManualClock()
    r = FunctionRouter("f", 64, 8, clock)
    r.add_instance(Instance("i0", "127.0.0.1:1", "node-0", 64))
    for _ in range(4):
        r.acquire()
    # 4 in flight where each instance is to carry 6: concurrency asks for one
    spec = common_pb2.FunctionSpec(name="f", concurrency=6, max_scale=8, llm=True)
    spec.autoscaling.ttft_ms = 500
    llm = LlmRouting(clock)
    assert llm.targets({"f": r}, {"f": spec}) == [("i0", "127.0.0.1:1")]
    settings = AutoscaleSettings(tick_s=1.0, stable_window_s=10.0)
    scaling = FunctionAutoscaling(settings, clock, llm.fleet)
    fast = FunctionAutoscaling(settings, clock, llm.fleet)
    seen: list[float] = []
    slow_started = fast_started = 0
    for k in range(6):
        clock.advance(1.0)
        # 4 in flight, 6 queued in the engine, first tokens at 4 s
        llm.observe("i0", Sample(waiting=6, running=4, ttft=cum([4.0] * (3 * k))))
        seen.append(llm.fleet(ScalingSignal("concurrency", ttft_s=0.5), r, 0.0))
        slow_started += sum(d.start for d in scaling.tick({"f": r}, {"f": spec}))
    assert seen[0] == 4.0  # the first scrape is a baseline
    assert seen[-1] == 4.0 * PRESSURE_MAX  # p90 ~4 s, 8x the 0.5 s target: capped
    assert slow_started > 0, "TTFT over target started nothing"
    # Without the TTFT target, the same load asks for nothing.
    plain = common_pb2.FunctionSpec(name="f", concurrency=6, max_scale=8, llm=True)
    for _ in range(6):
        clock.advance(1.0)
        fast_started += sum(d.start for d in fast.tick({"f": r}, {"f": plain}))
    assert fast_started == 0
