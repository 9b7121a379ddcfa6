"""Prefill/decode pairing and the KV inbox (pure, a manual clock)."""

from __future__ import annotations

import random

import pytest

from controlplane.llm.kvwire import InboxFull, KvInbox, valid_id
from controlplane.runtime.disagg import (
    LINKS,
    Candidate,
    Link,
    PairPicker,
    RandomPairPicker,
    by_node,
    kv_bytes,
)

SAME = Link("same-node", 10e9, 10e-6)
SLOW = Link("tcp", 1e9 / 8, 100e-6)  # 1 Gbit/s


def picker() -> PairPicker:
    return PairPicker(by_node(SAME, SLOW), prefill_tps=8000.0, decode_s_per_seq=0.0002)


def test_random_pairing_ignores_the_link_and_is_seeded() -> None:
    def rand(seed: int) -> RandomPairPicker:
        return RandomPairPicker(by_node(SAME, SLOW), 8000.0, 0.0002, random.Random(seed))

    pre = [Candidate(f"p{k}", f"n{k}") for k in range(4)]
    dec = [Candidate(f"d{k}", f"n{k}") for k in range(4)]
    big = rand(7).pick(pre, dec, 10_000, 819_200)
    picker_a, picker_b = rand(7), rand(7)
    a = [picker_a.pick(pre, dec, 100, 1000) for _ in range(40)]
    b = [picker_b.pick(pre, dec, 100, 1000) for _ in range(40)]
    assert [(p.prefill, p.decode) for p in a] == [(p.prefill, p.decode) for p in b]
    links = {p.link.name for p in a}
    assert links == {"same-node", "tcp"}  # the big cache's link is not a concern
    assert big.transfer_s == pytest.approx(big.link.transfer_s(8_192_000_000))
    with pytest.raises(ValueError, match="prefill pool"):
        rand(1).pick([], dec, 100, 1000)


def test_a_big_cache_stays_on_its_node() -> None:
    # 10k tokens of LLaMA-2-13B: 8.19 GB, 6.6 s over 1 Gbit/s, 0.8 s on the node.
    pair = picker().pick(
        [Candidate("p1", "n1"), Candidate("p2", "n2")],
        [Candidate("d1", "n2"), Candidate("d2", "n3")],
        prompt_tokens=10_000,
        kv_bytes_per_token=819_200,
    )
    assert (pair.prefill.instance_id, pair.decode.instance_id) == ("p2", "d1")
    assert pair.link is SAME
    assert pair.transfer_s == pytest.approx(SAME.transfer_s(8_192_000_000))


def test_a_busy_prefill_instance_loses_to_a_transfer_when_the_transfer_is_cheaper() -> None:
    # p1 shares a node with d1 but has 40k prompt tokens queued (5 s at 8k/s);
    # a 100-token cache (82 MB) crosses the slow link in 0.66 s.
    pair = picker().pick(
        [Candidate("p1", "n1", load=40_000), Candidate("p2", "n2")],
        [Candidate("d1", "n1")],
        prompt_tokens=100,
        kv_bytes_per_token=819_200,
    )
    assert pair.prefill.instance_id == "p2" and pair.link is SLOW


def test_decode_load_counts_per_output_token() -> None:
    prefill = [Candidate("p", "n1")]
    decode = [Candidate("busy", "n1", load=2000), Candidate("idle", "n2")]
    # 8.19 GB of cache: 0.82 s on the node, 65.5 s over the slow link.
    short = picker().pick(prefill, decode, 10_000, 819_200, output_tokens=1)
    long = picker().pick(prefill, decode, 10_000, 819_200, output_tokens=500)
    assert short.decode.instance_id == "busy"  # 0.4 s of slowdown < the hop
    assert long.decode.instance_id == "idle"  # 200 s of slowdown > the hop


def test_an_empty_pool_is_named() -> None:
    with pytest.raises(ValueError, match="decode pool"):
        picker().pick([Candidate("p", "n")], [], 1, 1)
    with pytest.raises(ValueError, match="prefill pool"):
        picker().pick([], [Candidate("d", "n")], 1, 1)


def test_links_and_sizes() -> None:
    assert kv_bytes(10_000, 819_200) == 8_192_000_000
    assert LINKS["rdma-sim"].simulated and not LINKS["tcp"].simulated
    assert SLOW.transfer_s(125_000_000) == pytest.approx(1.0001)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_inbox_is_bounded_and_entries_expire() -> None:
    clock = Clock()
    box = KvInbox(max_bytes=100, max_entries=2, ttl_s=10, clock=clock)
    a = box.reserve("a", 60, 6)
    with pytest.raises(InboxFull, match="60 of 100 held"):
        box.reserve("b", 50, 5)  # bytes reserved before they arrive count
    b = box.reserve("b", 40, 4)
    with pytest.raises(InboxFull):
        box.reserve("c", 0, 1)  # entries
    with pytest.raises(ValueError, match="already here"):
        box.reserve("a", 1, 1)
    assert box.take("a") is None  # still arriving
    a.data += b"x" * 60
    a.complete = True
    got = box.take("a")
    assert got is not None and got.tokens == 6 and box.held == 40
    assert box.take("a") is None  # used once
    clock.t = 11
    box.expire()
    assert box.held == 0 and not box.entries and b.kv_id == "b"
    box.reserve("d", 100, 1)  # all the room is back
    box.drop("d")
    assert box.held == 0


def test_kv_ids_are_short_and_plain() -> None:
    assert valid_id("abc-DEF_012")
    assert not valid_id("") and not valid_id("a" * 65)
    assert not valid_id("../etc") and not valid_id("a b")
