"""CreateWatch: which creates in flight are given up when their node is
declared dead or its agent stops answering (pure, a manual clock)."""

from __future__ import annotations

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.create_watch import CreateWatch


def watch() -> tuple[CreateWatch[str], ManualClock]:
    clock = ManualClock(100.0)
    return CreateWatch(clock, check_s=1.0), clock


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
    assert sorted(w.probed("n-1", answered=False)) == ["a", "b"]
    assert len(w) == 0


def test_a_slow_start_on_an_agent_that_answers_is_never_given_up() -> None:
    w, clock = watch()
    w.begin("slow", "n-1")
    for _ in range(30):  # a 30 s sandbox start, checked every second
        clock.advance(1.0)
        node = w.probe_due("slow")
        if node is not None:
            assert w.probed(node, answered=True) == []
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
    assert w.probed("n-1", answered=False) == ["b"]
    assert w.probed("n-1", answered=False) == []  # nothing left there


def test_check_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="check_s"):
        CreateWatch(ManualClock(), check_s=0)
