"""The emulated LLM engine's model (pure, a manual clock): TTFT from the
prompt at the prefill rate, TPOT growing with the batch, requests queueing
when the KV cache is full, prefix-cache hits shortening prefill, bounds."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.llm.engine import Engine, Profile, QueueFull, Request
from controlplane.runtime.llmprompt import block_hashes

P = Profile(
    name="t", prefill_tps=1000.0, tpot_base_s=0.01, tpot_per_seq_s=0.001,
    kv_bytes_per_token=1, kv_capacity_tokens=1000, block_tokens=4, max_running=8, max_waiting=3,
)  # fmt: skip


def drain(e: Engine, now: float = 0.0) -> float:
    """Run every iteration to the end; the time it ends."""
    while (s := e.plan(now)) is not None:
        e.complete(s)
        now = s.ends
    return now


def test_ttft_is_prefill_plus_one_decode_step() -> None:
    e = Engine(P)
    r = Request("a", prompt_tokens=500, max_tokens=3)
    e.submit(r)
    assert drain(e) == pytest.approx(0.5 + 3 * 0.011)
    assert r.first_token_at == pytest.approx(0.5 + 0.011)
    assert r.generated == 3 and r.finished_at is not None and not e.running


def test_decode_steps_slow_down_with_the_batch() -> None:
    roomy = dataclasses.replace(P, max_waiting=100)
    alone, crowd = Engine(roomy), Engine(roomy)
    alone.submit(Request("x", 1, 10))
    for i in range(8):
        crowd.submit(Request(f"r{i}", 1, 10))
    a, c = alone.plan(0.0), crowd.plan(0.0)
    assert a is not None and c is not None
    assert c.duration - 8 / 1000 == pytest.approx(0.01 + 8 * 0.001)
    assert a.duration - 1 / 1000 == pytest.approx(0.011)


def test_a_full_kv_cache_makes_requests_wait() -> None:
    e = Engine(P)
    big, next_ = Request("big", 700, 50), Request("next", 400, 5)
    e.submit(big)
    e.submit(next_)
    step = e.plan(0.0)
    assert step is not None and step.admitted == [big]  # 700 + 400 > 1000
    assert list(e.waiting) == [next_]
    drain(e)
    assert next_.first_token_at is not None and next_.first_token_at > big.finished_at  # type: ignore[operator]


def test_a_shared_prefix_is_not_prefilled_twice() -> None:
    e = Engine(P)
    system = [f"w{i}" for i in range(400)]
    first = Request("1", 404, 1, block_hashes([*system, "a", "b", "c", "d"], 4))
    e.submit(first)
    drain(e)
    second = Request("2", 404, 1, block_hashes([*system, "x", "y", "z", "q"], 4))
    e.submit(second)
    step = e.plan(10.0)
    assert step is not None and second.cached_tokens == 400
    assert step.duration == pytest.approx(4 / 1000 + 0.011)
    assert e.counters.prefix_hits == 400 and e.counters.prefix_queries == 808


def test_bounds() -> None:
    e = Engine(P)
    with pytest.raises(ValueError, match="exceed the KV cache"):
        e.submit(Request("huge", 990, 20))
    for i in range(3):
        e.submit(Request(f"w{i}", 1, 1))
    with pytest.raises(QueueFull):
        e.submit(Request("one-too-many", 1, 1))
    assert Engine(P).plan(0.0) is None  # idle: nothing to do, no busy loop
