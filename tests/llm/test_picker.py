"""The LLM picker's choices: each term moves the pick the way it says,
weights are validated by name, the approximate index ages out by the
injected clock, and the baselines behave as named."""

from __future__ import annotations

import pytest

from controlplane.runtime.llmpicker import (
    Ask,
    Candidate,
    LeastRequest,
    RoundRobin,
    ScoredPicker,
    View,
    check_weights,
    kv_term,
    make,
)
from controlplane.runtime.llmsignals import Load, Sample


def cand(name: str, inflight: int = 0, **sample: object) -> Candidate:
    return Candidate(name, inflight, Load(name, 0.0, Sample(**sample)))  # type: ignore[arg-type]


def test_queue_term_prefers_the_shorter_queue() -> None:
    p = ScoredPicker({"queue": 1.0})
    assert p.pick([cand("a", 3), cand("b", 1, waiting=1), cand("c", 4)], Ask()) == "b"


def test_kv_term_prefers_free_cache() -> None:
    p = ScoredPicker({"kv": 1.0})
    assert p.pick([cand("a", kv_usage=0.9), cand("b", kv_usage=0.2)], Ask()) == "b"


def test_an_instance_without_the_kv_signal_scores_the_mean_of_the_others() -> None:
    unknown = Candidate("new", 0, None)  # not scraped yet
    # Three idle instances, one not scraped yet: a second new prompt goes
    # to it, as to any instance sent nothing (a fixed 0.5 sent it to "z").
    spread = ScoredPicker()
    fleet = [cand("x", kv_usage=0.02), unknown, cand("z", kv_usage=0.02)]
    assert spread.pick(fleet, Ask(("p",))) == "x"  # all equal: the first
    assert spread.pick(fleet, Ask(("q",))) == "new"  # equal: fewest blocks sent
    # The mean of those that report it: not below a little use, nor above.
    p = ScoredPicker({"kv": 1.0})
    assert p.pick([cand("a", kv_usage=0.1), unknown, cand("b", kv_usage=0.3)], Ask()) == "a"
    view = View(Ask(), [], {}, kv_known=0.8)
    assert kv_term(unknown, view) == 0.8 and kv_term(cand("a", kv_usage=0.1), view) == 0.9


def test_approximate_prefix_follows_where_blocks_were_sent() -> None:
    now = [0.0]
    p = ScoredPicker({"prefix": 3.0, "queue": 1.0}, clock=lambda: now[0], index_ttl_s=10.0)
    sys_a = Ask(("a0", "a1", "a2"))
    first = p.pick([cand("x"), cand("y")], sys_a)
    assert first == "x"  # tie: shorter queue, then first
    # The same prefix goes back there even though it is now the busier one.
    loaded = [cand("x", 1), cand("y", 0)]
    assert p.pick(loaded, Ask(("a0", "a1", "u9"))) == "x"
    # A different prefix goes by queue.
    assert p.pick(loaded, Ask(("b0", "b1"))) == "y"
    # Past the TTL the index no longer counts.
    now[0] = 11.0
    assert p.pick(loaded, sys_a) == "y"


def test_new_prefixes_spread_over_an_idle_fleet() -> None:
    # Equal scores (idle, nothing cached): each new prefix goes to the
    # instance sent the fewest blocks, not always to the first one.
    p = ScoredPicker()
    idle = [cand("x"), cand("y"), cand("z")]
    got = [p.pick(idle, Ask((f"s{k}.0", f"s{k}.1"))) for k in range(6)]
    assert sorted(got) == ["x", "x", "y", "y", "z", "z"]
    # And each comes back to where it went.
    assert [p.pick(idle, Ask((f"s{k}.0", f"s{k}.1", "u"))) for k in range(6)] == got


def test_forget_drops_an_instance_from_the_index() -> None:
    p = ScoredPicker({"prefix": 3.0, "queue": 1.0})
    p.pick([cand("x"), cand("y", 1)], Ask(("a0",)))
    p.forget("x")
    assert p.pick([cand("x", 1), cand("y", 0)], Ask(("a0",))) == "y"


def test_precise_prefix_reads_reported_blocks() -> None:
    p = ScoredPicker({"prefix_precise": 3.0, "queue": 1.0})
    ask = Ask(("a0", "a1", "a2", "a3"))
    # y reports a deep block of the prompt (a bounded sample: a0 is absent).
    cands = [cand("x", 0, blocks=frozenset({"a0"})), cand("y", 2, blocks=frozenset({"a2"}))]
    assert p.pick(cands, ask) == "y"


def test_adapter_affinity() -> None:
    p = ScoredPicker({"adapter": 1.0, "queue": 0.1})
    cands = [cand("x"), cand("y", 2, adapters=frozenset({"sql"}))]
    assert p.pick(cands, Ask(adapter="sql")) == "y"
    assert p.pick(cands, Ask()) == "x"


def test_no_signal_is_neutral_not_an_error() -> None:
    p = ScoredPicker()
    assert p.pick([Candidate("x", 2), Candidate("y", 0)], Ask(("a",))) == "y"


def test_weights_are_validated_by_name() -> None:
    with pytest.raises(ValueError, match="'nope' is unknown"):
        check_weights({"nope": 1.0})
    with pytest.raises(ValueError, match="weight of 'kv'"):
        check_weights({"kv": -1.0})
    with pytest.raises(ValueError, match="at least one"):
        check_weights({"kv": 0.0})
    with pytest.raises(ValueError, match="no instance"):
        ScoredPicker().pick([], Ask())


def test_baselines() -> None:
    assert LeastRequest().pick([cand("a", 2), cand("b", 1)], Ask()) == "b"
    rr = RoundRobin()
    assert [rr.pick([cand("a"), cand("b")], Ask()) for _ in range(3)] == ["a", "b", "a"]
    with pytest.raises(ValueError, match="'fastest' is unknown"):
        make("fastest", lambda: 0.0)
