"""Dispatch's LLM hook (functions/dispatch/llmroute.py): the picker chooses
the granted instance of an LLM function, the scaling metric is what the
autoscaler observes, and the spec's new fields are checked naming the field.
Pure objects with a manual clock; the scrape against a real emulated server
on a real socket."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestServer

from controlplane.llm.engine import Engine
from controlplane.llm.profiles import profile
from controlplane.llm.server import LlmServer
from controlplane.runtime import spec as specs
from controlplane.runtime import validation
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.llmprompt import hint_blocks
from controlplane.runtime.llmsignals import Sample
from functions.dispatch.autoscale import FunctionAutoscaling
from functions.dispatch.autoscaling.settings import AutoscaleSettings
from functions.dispatch.llmroute import LlmRouting
from functions.dispatch.policy import FunctionRouter, Instance
from galaxy.v1 import common_pb2, dispatch_pb2


def router(clock: ManualClock, n: int = 3, concurrency: int = 64) -> FunctionRouter:
    r = FunctionRouter("f", concurrency, 8, clock)
    for k in range(n):
        r.add_instance(Instance(f"i{k}", f"127.0.0.1:{k + 1}", "node-0", concurrency))
    return r


def llm_spec(**autoscaling: object) -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec(name="f", concurrency=64, max_scale=8, llm=True)
    for k, v in autoscaling.items():
        setattr(s.autoscaling, k, v)
    return s


def hint(system: str, user: str) -> dispatch_pb2.RoutingHint:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    return dispatch_pb2.RoutingHint(prefix_blocks=hint_blocks(body))


SYSTEMS = [" ".join(f"s{k}w{j}" for j in range(64)) for k in range(3)]


def test_a_prefix_sticks_to_the_instance_it_was_sent_to_though_busier() -> None:
    clock = ManualClock()
    r, llm, spec = router(clock), LlmRouting(clock), llm_spec()
    first = {k: llm.acquire(r, spec, hint(s, "hello")) for k, s in enumerate(SYSTEMS)}
    homes = {k: g.instance.instance_id for k, g in first.items() if g is not None}
    assert len(set(homes.values())) == 3  # three prefixes, spread while idle
    for user in range(5):  # the homes get busier; each prefix still goes home
        for k, s in enumerate(SYSTEMS):
            g = llm.acquire(r, spec, hint(s, f"question {user}"))
            assert g is not None and g.instance.instance_id == homes[k]


def test_least_request_spreads_a_prefix_instead() -> None:
    # The same requests under the baseline: what the picker is compared with.
    clock = ManualClock()
    r, llm, spec = router(clock), LlmRouting(clock, "least-request"), llm_spec()
    got = {llm.acquire(r, spec, hint(SYSTEMS[0], f"q{u}")).instance.instance_id for u in range(3)}  # type: ignore[union-attr]
    assert len(got) == 3


def test_a_scraped_queue_steers_new_requests_away() -> None:
    clock = ManualClock()
    r, llm, spec = router(clock), LlmRouting(clock), llm_spec()
    llm.book.observe("i0", Sample(waiting=12, running=8, kv_usage=0.9), clock.now())
    llm.book.observe("i1", Sample(waiting=0, running=1, kv_usage=0.1), clock.now())
    llm.book.observe("i2", Sample(waiting=6, running=8, kv_usage=0.5), clock.now())
    g = llm.acquire(r, spec, dispatch_pb2.RoutingHint())
    assert g is not None and g.instance.instance_id == "i1"
    # A stale sample no longer counts: with none fresh, in-flight counts decide.
    clock.advance(10.0)
    g2 = llm.acquire(r, spec, dispatch_pb2.RoutingHint())
    assert g2 is not None and g2.instance.instance_id != "i1"  # i1 holds one now


def test_a_function_that_is_not_an_llm_gets_the_least_loaded_instance() -> None:
    clock = ManualClock()
    r, llm = router(clock), LlmRouting(clock)
    spec = common_pb2.FunctionSpec(name="f", concurrency=64)
    llm.book.observe("i0", Sample(waiting=50), clock.now())  # ignored: not an LLM
    g = llm.acquire(r, spec, hint(SYSTEMS[0], "x"))
    assert g is not None and g.instance.instance_id == "i0"  # oldest of the idle


def test_waiters_go_first_and_a_full_instance_is_not_picked() -> None:
    clock = ManualClock()
    r, llm, spec = router(clock, n=2, concurrency=1), LlmRouting(clock), llm_spec()
    a = llm.acquire(r, spec, hint(SYSTEMS[0], "x"))
    assert a is not None
    b = llm.acquire(r, spec, hint(SYSTEMS[0], "y"))  # its home is full: the other one
    assert b is not None and b.instance.instance_id != a.instance.instance_id
    assert llm.acquire(r, spec, hint(SYSTEMS[0], "z")) is None
    r.enqueue()
    r.release(a.lease_id)  # the freed slot went to the waiter
    assert llm.acquire(r, spec, hint(SYSTEMS[0], "w")) is None


def test_targets_are_the_llm_instances_and_gone_ones_are_forgotten() -> None:
    clock = ManualClock()
    r, llm = router(clock), LlmRouting(clock)
    other = FunctionRouter("g", 1, 1, clock)
    other.add_instance(Instance("j0", "127.0.0.1:9", "node-0", 1))
    specs_by = {"f": llm_spec(), "g": common_pb2.FunctionSpec(name="g")}
    llm.book.observe("i2", Sample(waiting=1), clock.now())
    assert sorted(llm.targets({"f": r, "g": other}, specs_by)) == [
        ("i0", "127.0.0.1:1"), ("i1", "127.0.0.1:2"), ("i2", "127.0.0.1:3"),
    ]  # fmt: skip
    r.remove_instance("i2")
    llm.targets({"f": r, "g": other}, specs_by)
    assert "i2" not in llm.book.known()


async def test_scrape_reads_a_real_emulated_server() -> None:
    clock = ManualClock()
    server = LlmServer(Engine(profile("smollm2-135m-cpu")), "m")
    async with TestServer(server.app()) as ts:
        llm = LlmRouting(clock)
        try:
            answered = await llm.scrape_round(
                [("a", f"{ts.host}:{ts.port}"), ("b", "127.0.0.1:1")], sign=lambda iid: "t"
            )
        finally:
            await llm.close()
    assert answered == 1  # the unreachable one is skipped, not waited for
    assert llm.book.get("a", clock.now()) is not None and llm.book.get("b", 0.0) is None


def test_the_scaling_metric_drives_the_decision_and_names_itself() -> None:
    clock = ManualClock()
    settings = AutoscaleSettings(tick_s=1.0, stable_window_s=10.0)
    r = router(clock, n=1)
    for _ in range(6):  # six requests in flight: concurrency 6 of 64 slots
        r.acquire()
    llm = LlmRouting(clock)
    by_queue = FunctionAutoscaling(settings, clock, llm.fleet)
    by_concurrency = FunctionAutoscaling(settings, clock, llm.fleet)
    queue_spec = llm_spec(metric="queue", target=2.0)
    conc_spec = llm_spec()
    decisions: list = []
    for _ in range(3):
        clock.advance(1.0)
        # The engine reports more than Dispatch's slots show: 6 running, 10 waiting.
        llm.book.observe("i0", Sample(waiting=10, running=6), clock.now())
        decisions += by_queue.tick({"f": r}, {"f": queue_spec})
        assert by_concurrency.tick({"f": r}, {"f": conc_spec}) == []
    started = [d for d in decisions if d.start]
    assert started, "the queue metric asked for no instance"
    assert started[0].reason.startswith("queue ")
    assert "16.00" in started[0].reason  # the engine's queue, not the 6 in flight


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"metric": "queue_depthx"}, "autoscaling.metric"),
        ({"metric": 3}, "autoscaling.metric"),
        ({"metric": "kv", "target": 1.5}, "autoscaling.target"),
        ({"target": -1}, "autoscaling.target"),
        ({"ttft_ms": 700_000}, "autoscaling.ttft_ms"),
        ({"tpot_ms": "fast"}, "autoscaling.tpot_ms"),
    ],
)
def test_bad_scaling_fields_are_refused_naming_the_field(doc: dict, field: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(field)):
        s = specs.from_dict({"name": "f", "runtime": "r", "autoscaling": doc})
        validation.check_autoscaling(s.autoscaling)


def test_a_good_scaling_block_is_kept() -> None:
    s = specs.from_dict(
        {
            "name": "f",
            "runtime": "r",
            "autoscaling": {"metric": "kv", "target": 0.6, "ttft_ms": 900},
        }
    )
    validation.check_autoscaling(s.autoscaling)
    assert (s.autoscaling.metric, s.autoscaling.target, s.autoscaling.ttft_ms) == ("kv", 0.6, 900)
    assert set(validation.SCALING_METRICS) == set(
        __import__("functions.dispatch.autoscaling.llmsignal", fromlist=["METRICS"]).METRICS
    )


def test_hint_blocks_read_every_prompt_form() -> None:
    words = " ".join(f"w{k}" for k in range(40))
    as_string = hint_blocks({"messages": [{"role": "user", "content": words}]})
    as_parts = hint_blocks(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": words}]}]}
    )
    assert len(as_string) == 2 and as_parts == as_string  # "user:" + 40 words: 2 blocks
    assert len(hint_blocks({"prompt": words})) == 2
    assert hint_blocks({"galaxy_prefix_blocks": list(range(100))})[:2] == ("0", "1")
    assert len(hint_blocks({"galaxy_prefix_blocks": list(range(100))})) == 64
    # What cannot be read gives no hint (the instance answers the error).
    assert hint_blocks({"messages": [{"role": "user", "content": 3}]}) == ()
    assert hint_blocks([1, 2]) == ()


def test_a_hint_out_of_bounds_is_refused_naming_the_field() -> None:
    too_many = dispatch_pb2.DispatchRequest(function="f")
    too_many.hint.prefix_blocks.extend(["a"] * 65)
    with pytest.raises(InvalidArgument, match=r"hint\.prefix_blocks"):
        validation.check_dispatch(too_many)
    too_long = dispatch_pb2.DispatchRequest(function="f")
    too_long.hint.prefix_blocks.append("x" * 33)
    with pytest.raises(InvalidArgument, match=r"hint\.prefix_blocks"):
        validation.check_dispatch(too_long)
