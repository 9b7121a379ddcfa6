"""CreateWatch: which creates in flight are given up when their node is
declared dead or its agent stops answering, and which wait on because their
agent answers, late or not (pure, a manual clock)."""

from __future__ import annotations

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.create_watch import CreateWatch, Verdict


def watch() -> tuple[CreateWatch[str], ManualClock]:
    clock = ManualClock(100.0)
    return CreateWatch(clock, check_s=1.0, probe_timeout_s=3.0), clock


def test_a_dead_node_gives_up_exactly_its_creates() -> None:
    w, _ = watch()
    w.begin("a", "n-1")
    w.begin("b", "n-1")
    w.begin("c", "n-2")
    assert sorted(w.node_dead("n-1")) == ["a", "b"]
    assert w.node_dead("n-1") == []  # given up once
    assert len(w) == 1 and w.node_dead("n-2") == ["c"]


def test_a_create_is_checked_only_after_check_s_without_news() -> None:
    w, clock = watch()
    w.begin("a", "n-1")
    clock.advance(0.9)
    assert w.probe_due("a") is None  # not waited long enough
    clock.advance(0.2)
    assert w.probe_due("a") == "n-1"


def test_one_probe_per_node_decides_for_every_create_there() -> None:
    w, clock = watch()
    w.begin("a", "n-1")
    w.begin("b", "n-1")
    clock.advance(1.5)
    assert w.probe_due("a") == "n-1"
    assert w.probe_due("b") is None  # the probe under way answers for it
    assert sorted(w.probed("n-1", None)) == ["a", "b"]
    assert len(w) == 0


def test_a_slow_start_on_an_agent_that_answers_is_never_given_up() -> None:
    w, clock = watch()
    w.begin("slow", "n-1")
    for _ in range(30):  # a 30 s sandbox start, checked every second
        clock.advance(1.0)
        node = w.probe_due("slow")
        if node is not None:
            assert w.probed(node, 0.2) == []
    assert len(w) == 1 and w.node_dead("n-1") == ["slow"]


def test_news_from_the_agent_spares_a_probe() -> None:
    w, clock = watch()
    w.begin("a", "n-1")
    w.begin("b", "n-1")
    clock.advance(1.5)
    w.heard("n-1")  # another create there was just answered
    w.end("b")
    assert w.probe_due("a") is None
    clock.advance(1.0)
    assert w.probe_due("a") == "n-1"


def test_a_create_that_ends_while_its_node_is_probed_is_not_given_up() -> None:
    w, clock = watch()
    w.begin("a", "n-1")
    clock.advance(1.0)
    assert w.probe_due("a") == "n-1"
    w.end("a")  # answered meanwhile
    w.begin("b", "n-1")  # a new one there: the probe under way covers it
    assert w.probed("n-1", None) == ["b"]
    assert w.probed("n-1", None) == []  # nothing left there


def test_a_start_on_a_starved_agent_that_answers_late_is_not_given_up() -> None:
    # An engine importing for minutes beside the agent starves it: its
    # probe answers come 8 s late, past probe_timeout_s, but they come.
    w, clock = watch()
    w.begin("vllm", "n-1", limit_s=600.0)  # the runtime's startup timeout
    for _ in range(20):
        clock.advance(1.0)
        node = w.probe_due("vllm")
        if node is None:
            continue
        # The probe may wait for its answer as long as the start may last.
        assert w.probe_deadline_s(node) == pytest.approx(600.0 - (clock.now() - 100.0))
        clock.advance(8.0)
        assert w.verdict(8.0) is Verdict.LATE
        assert w.probed(node, 8.0) == []
    assert len(w) == 1 and w.late_answers >= 2


def test_a_stuck_start_ends_by_its_limit() -> None:
    w, clock = watch()
    w.begin("a", "n-1", limit_s=60.0)
    w.begin("b", "n-1", limit_s=90.0)
    clock.advance(1.0)
    assert w.probe_due("a") == "n-1"
    # One probe for both: it waits until the later limit, no longer.
    assert w.probe_deadline_s("n-1") == pytest.approx(89.0)
    clock.advance(89.0)
    assert sorted(w.probed("n-1", None)) == ["a", "b"]  # no answer by then: given up


def test_the_probe_waits_at_most_patience_s_and_at_least_probe_timeout_s() -> None:
    clock = ManualClock(0.0)
    w: CreateWatch[str] = CreateWatch(clock, check_s=1.0, probe_timeout_s=3.0, patience_s=20.0)
    w.begin("long", "n-1", limit_s=600.0)
    w.begin("short", "n-2", limit_s=2.0)
    w.begin("bare", "n-3")  # no limit: the old rule
    clock.advance(1.5)
    assert w.probe_deadline_s("n-1") == 20.0
    assert w.probe_deadline_s("n-2") == 3.0
    assert w.probe_deadline_s("n-3") == 3.0
    assert w.verdict(2.9) is Verdict.ANSWERED and w.verdict(None) is Verdict.NO_ANSWER


def test_check_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="check_s"):
        CreateWatch(ManualClock(), check_s=0)
    with pytest.raises(ValueError, match="patience_s"):
        CreateWatch(ManualClock(), probe_timeout_s=3.0, patience_s=1.0)
    with pytest.raises(ValueError, match="limit_s"):
        CreateWatch(ManualClock()).begin("a", "n-1", limit_s=0)
