"""The prefill half of a disaggregated request in Dispatch (pure, a manual
clock), the spec's `pd` block and hint bounds (errors name the field), and
the gateway's helpers: where the cache goes and how long the prompt is."""

from __future__ import annotations

import re

import pytest

from controlplane.gateway.pd import kv_target, prompt_tokens
from controlplane.runtime import spec as specs
from controlplane.runtime import validation
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.disagg import LINKS, Link, by_node
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.llmsignals import Sample
from functions.dispatch.llmroute import PD_PAIRS, LlmRouting
from functions.dispatch.pdpair import PrefillPairing
from functions.dispatch.policy import FunctionRouter, Instance
from galaxy.v1 import common_pb2, dispatch_pb2

SPEC = common_pb2.FunctionSpec(name="pf", concurrency=8, max_scale=8, llm=True)


def prefill_pool(clock: ManualClock, nodes: list[str]) -> FunctionRouter:
    r = FunctionRouter("pf", 8, 8, clock)
    for k, node in enumerate(nodes):
        r.add_instance(Instance(f"p{k}", f"10.0.0.{k}:80", node, 8))
    return r


def pd_hint(node: str, tokens: int = 400, per_token: int = 0) -> dispatch_pb2.RoutingHint:
    pd = common_pb2.PdSpec(prefill="pf", kv_bytes_per_token=per_token)
    return dispatch_pb2.RoutingHint(decode_node=node, prompt_tokens=tokens, pd=pd)


def test_the_prefill_instance_on_the_decode_node_is_chosen() -> None:
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1", "n2"]), LlmRouting(clock)
    same = PD_PAIRS.labels("same-node")._value.get()
    for node, want in (("n1", "p1"), ("n2", "p2"), ("n0", "p0")):
        g = llm.acquire(r, SPEC, pd_hint(node))
        assert g is not None and g.instance.instance_id == want
        r.release(g.lease_id)
    assert PD_PAIRS.labels("same-node")._value.get() == same + 3


def test_a_queue_on_the_same_node_costs_more_than_the_network() -> None:
    # 400 tokens at 2,000 tokens/s: each request queued there costs 0.2 s,
    # far more than 7 MB over either link.
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1"]), LlmRouting(clock)
    llm.book.observe("p1", Sample(waiting=3, running=1), clock.now())
    g = llm.acquire(r, SPEC, pd_hint("n1"))
    assert g is not None and g.instance.instance_id == "p0"


def test_a_scrape_older_than_a_returned_slot_does_not_count_it() -> None:
    # Requests one after another: the scrape caught the previous one running
    # on the decode's node; its slot came back since, so that instance is
    # idle and wins again (it crossed nodes before, in a real run).
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1"]), LlmRouting(clock)
    first = llm.acquire(r, SPEC, pd_hint("n1"))
    assert first is not None and first.instance.instance_id == "p1"
    clock.advance(0.01)
    llm.observe("p1", Sample(waiting=0, running=1), sent_at=clock.now())
    clock.advance(0.01)
    r.release(first.lease_id)
    g = llm.acquire(r, SPEC, pd_hint("n1"))
    assert g is not None and g.instance.instance_id == "p1"
    # A scrape sent after the return counts again.
    r.release(g.lease_id)
    clock.advance(0.01)
    llm.observe("p1", Sample(waiting=1, running=1), sent_at=clock.now())
    g = llm.acquire(r, SPEC, pd_hint("n1"))
    assert g is not None and g.instance.instance_id == "p0"


def test_a_large_cache_stays_on_its_node_despite_a_queue() -> None:
    # LLaMA-2-13B's 819,200 bytes a token: 8 GB for 10k tokens takes 66 s
    # over a 1 Gbit/s link, more than one queued prompt (5 s at 2,000
    # tokens/s) on the decode's node.
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1"]), LlmRouting(clock)
    llm.pairing = PrefillPairing(by_node(LINKS["same-node"], Link("tcp", 1e9 / 8)))
    llm.book.observe("p1", Sample(waiting=0, running=0), clock.now())
    r.acquire_on("p1")  # one in flight on the decode's node
    g = llm.acquire(r, SPEC, pd_hint("n1", tokens=10_000, per_token=819_200))
    assert g is not None and g.instance.instance_id == "p1"


def test_a_prefill_pool_that_is_not_scraped_is_paired_too() -> None:
    # llama-cpp-galaxy serves no /metrics: not `llm`, in-flight counts only.
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1"]), LlmRouting(clock)
    plain = common_pb2.FunctionSpec(name="pf", concurrency=8, max_scale=8)
    g = llm.acquire(r, plain, pd_hint("n1"))
    assert g is not None and g.instance.instance_id == "p1"


def test_without_a_decode_node_the_picker_chooses_as_usual() -> None:
    clock = ManualClock()
    r, llm = prefill_pool(clock, ["n0", "n1"]), LlmRouting(clock)
    g = llm.acquire(r, SPEC, dispatch_pb2.RoutingHint())
    assert g is not None  # any instance: the LLM picker's call


@pytest.mark.parametrize(
    ("pd", "field"),
    [
        ({"prefill": ""}, "pd.prefill"),
        ({"prefill": "Not_A_Name"}, "pd.prefill"),
        ({"prefill": "f"}, "pd.prefill"),  # itself
        ({"prefill": "p", "kv_bytes_per_token": -1}, "pd.kv_bytes_per_token"),
        ({"prefill": "p", "prefill_tps": "fast"}, "pd.prefill_tps"),
        ({"prefill": "p", "prefill_tps": 1e12}, "pd.prefill_tps"),
        ({"prefill": "p", "decode": "x"}, "pd.decode"),
        ("p", "pd"),
    ],
)
def test_a_bad_pd_block_is_refused_naming_the_field(pd: object, field: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(field)):
        s = specs.from_dict({"name": "f", "runtime": "r", "pd": pd})
        validation.check_spec(s, resolved=False)


def test_a_good_pd_block_is_kept() -> None:
    s = specs.from_dict({"name": "f", "runtime": "r", "pd": {"prefill": "p", "prefill_tps": 450}})
    validation.check_spec(s, resolved=False)
    assert (s.pd.prefill, s.pd.prefill_tps, s.pd.kv_bytes_per_token) == ("p", 450.0, 0)


def test_a_pd_hint_out_of_bounds_is_refused_naming_the_field() -> None:
    req = dispatch_pb2.DispatchRequest(function="pf", hint=pd_hint("n0"))
    validation.check_dispatch(req)
    req.hint.pd.prefill_tps = float("nan")
    with pytest.raises(InvalidArgument, match=r"hint\.pd\.prefill_tps"):
        validation.check_dispatch(req)
    req.hint.pd.prefill_tps, req.hint.decode_node = 0, "x" * 300
    with pytest.raises(InvalidArgument, match=r"hint\.decode_node"):
        validation.check_dispatch(req)


def test_the_cache_goes_through_shared_memory_on_one_node_else_tcp() -> None:
    decode = dispatch_pb2.InstanceAddr(instance_id="d-1", address="10.0.0.9:81", node_id="n1")
    near = dispatch_pb2.InstanceAddr(instance_id="p-1", node_id="n1")
    far = dispatch_pb2.InstanceAddr(instance_id="p-2", node_id="n2")
    assert kv_target(decode, near) == "shm:@galaxy-kvfd-d-1"
    assert kv_target(decode, far) == "http://10.0.0.9:81"


def test_prompt_tokens_read_every_prompt_form() -> None:
    assert prompt_tokens({"messages": [{"role": "user", "content": "a b c"}]}) == 4  # "user:"
    assert prompt_tokens({"prompt": "a b c"}) == 3
    assert prompt_tokens({"galaxy_prompt_tokens": 900, "prompt": "a"}) == 900
    assert prompt_tokens({"messages": 3}) == 0
    assert prompt_tokens({"galaxy_prompt_tokens": True}) == 0
