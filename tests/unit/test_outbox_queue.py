"""The outbox's queueing decisions (``OutboxQueue``), without I/O: a manual
clock gives the times, the test plays the driver (asyncio ``Outbox`` in
production, ``simulator.galaxy.modnodes`` in the model)."""

from __future__ import annotations

import pytest

from controlplane.runtime.clock import ManualClock
from functions.clustermgr.outbox_queue import BATCH, Entry, OutboxQueue


def _q(*, tries: int = 3, backoff_s: float = 0.1) -> OutboxQueue[str]:
    return OutboxQueue(tries=tries, backoff_s=backoff_s)


def _batch(r: list[Entry[str]] | float | None) -> list[tuple[str, str]]:
    assert isinstance(r, list), r
    return [(e.node_id, e.item) for e in r]


def test_a_change_is_due_at_once_and_the_queue_goes_idle_after_it() -> None:
    clock = ManualClock(10.0)
    q = _q()
    assert q.idle
    assert q.put("n1", "a", now=clock.now()) == 10.0
    assert _batch(q.poll(clock.now())) == [("n1", "a")]
    assert q.in_flight and len(q) == 0
    clock.advance(0.01)
    assert q.sent(clock.now()) is None
    assert q.idle and q.poll(clock.now()) is None


def test_refreshes_linger_and_travel_together() -> None:
    clock = ManualClock()
    q = _q()
    assert q.put("n1", "r1", now=clock.now(), wait_s=1.0) == 1.0
    clock.advance(0.4)
    # Already waking at 1.0: nothing new for the driver.
    assert q.put("n2", "r2", now=clock.now(), wait_s=1.0) is None
    assert q.poll(clock.now()) == 1.0  # woken early: wait on
    clock.set(1.0)
    assert _batch(q.poll(clock.now())) == [("n1", "r1"), ("n2", "r2")]


def test_a_change_cuts_a_linger_short_and_takes_the_refreshes_along() -> None:
    clock = ManualClock()
    q = _q()
    assert q.put("n1", "r1", now=clock.now(), wait_s=1.0) == 1.0
    clock.advance(0.3)
    assert q.put("n2", "c2", now=clock.now()) == pytest.approx(0.3)
    # A second change: the send is already due now.
    assert q.put("n3", "c3", now=clock.now()) is None
    assert _batch(q.poll(clock.now())) == [("n1", "r1"), ("n2", "c2"), ("n3", "c3")]


def test_a_refresh_replacing_an_unsent_change_stays_urgent() -> None:
    q = _q(backoff_s=0.5)
    assert q.put("n1", "c1", now=0.0) == 0.0
    assert q.put("n1", "r1", now=0.0, wait_s=1.0) is None
    r = q.poll(0.0)
    assert _batch(r) == [("n1", "r1")]
    assert isinstance(r, list) and r[0].urgent


def test_newest_wins_and_goes_to_the_end() -> None:
    q = _q()
    q.put("n1", "a1", now=0.0)
    q.put("n2", "b1", now=0.0)
    q.put("n1", "a2", now=0.0)
    assert len(q) == 2
    assert _batch(q.poll(0.0)) == [("n2", "b1"), ("n1", "a2")]


def test_calls_carry_at_most_a_batch_and_the_round_goes_on() -> None:
    q = _q()
    for i in range(BATCH * 2 + 3):
        q.put(f"n{i}", f"s{i}", now=0.0)
    sizes = []
    t: float | None = 0.0
    while t is not None:
        r = q.poll(t)
        assert isinstance(r, list)
        sizes.append(len(r))
        t = q.sent(t + 0.1)  # the next call at once, no linger
    assert sizes == [BATCH, BATCH, 3]
    assert q.idle and len(q) == 0 and q.poll(1.0) is None


def test_what_arrives_in_flight_goes_with_the_next_call_refreshes_too() -> None:
    q = _q()
    q.put("n1", "c1", now=0.0)
    assert _batch(q.poll(0.0)) == [("n1", "c1")]
    # In flight: nothing is due until the call returns.
    assert q.put("n2", "r2", now=0.1, wait_s=1.0) is None
    assert q.put("n1", "c1b", now=0.1) is None
    assert q.sent(0.2) == 0.2  # no linger: the round is paid for
    assert _batch(q.poll(0.2)) == [("n2", "r2"), ("n1", "c1b")]
    assert q.sent(0.3) is None and q.idle


def test_a_failed_call_is_retried_after_a_backoff_then_given_up() -> None:
    clock = ManualClock()
    q = _q(tries=3, backoff_s=0.1)
    q.put("n1", "c1", now=clock.now())
    backoffs = []
    for _ in range(3):
        r = q.poll(clock.now())
        assert _batch(r) == [("n1", "c1")]
        start = clock.now()
        due, lost = q.failed(start)
        backoffs.append(round(due - start, 9))
        # Nothing shortens a backoff, not even a change for another node.
        if not lost:
            assert q.poll(start) == due
            clock.set(due)
    assert backoffs == [0.1, 0.2, 0.4]  # doubling
    assert [(e.node_id, e.tried) for e in lost] == [("n1", 2)]
    clock.set(due)
    assert q.poll(clock.now()) is None and q.idle


def test_a_backoff_is_not_cut_short_but_a_change_skips_the_linger_after_it() -> None:
    q = _q(backoff_s=0.1)
    q.put("n1", "r1", now=0.0, wait_s=1.0)
    assert _batch(q.poll(1.0)) == [("n1", "r1")]
    due, lost = q.failed(1.0)
    assert due == pytest.approx(1.1) and lost == []
    # A retry of refreshes alone lingers again after the backoff.
    assert q.poll(due) == pytest.approx(due + 1.0)
    assert _batch(q.poll(due + 1.0)) == [("n1", "r1")]
    due, _ = q.failed(due + 1.0)
    assert q.put("n2", "c2", now=due - 0.05) is None  # backing off
    assert _batch(q.poll(due)) == [("n1", "r1"), ("n2", "c2")]


def test_a_newer_message_supersedes_a_failed_one() -> None:
    q = _q(backoff_s=0.1)
    q.put("n1", "old", now=0.0)
    assert _batch(q.poll(0.0)) == [("n1", "old")]
    q.put("n1", "new", now=0.05)  # in flight
    due, lost = q.failed(0.1)
    assert [e.item for e in lost] == ["old"]
    assert _batch(q.poll(due)) == [("n1", "new")]


def test_a_success_resets_the_backoff() -> None:
    q = _q(backoff_s=0.1, tries=10)
    q.put("n1", "a", now=0.0)
    q.poll(0.0)
    due, _ = q.failed(0.0)
    q.poll(due)
    due2, _ = q.failed(due)
    assert due2 - due == pytest.approx(0.2)
    q.poll(due2)
    q.put("n2", "b", now=due2)  # in flight: goes next
    assert q.sent(due2) == due2
    q.poll(due2)
    due3, _ = q.failed(due2)
    assert due3 - due2 == pytest.approx(0.1)


def test_an_upsert_replacing_an_unsent_remove_carries_a_reset() -> None:
    q = _q()
    q.put("n1", "remove", now=0.0, remove=True)
    q.put("n1", "upsert", now=0.0)
    q.put("n2", "upsert", now=0.0)
    r = q.poll(0.0)
    assert isinstance(r, list)
    assert [(e.item, e.reset) for e in r] == [("upsert", True), ("upsert", False)]


def test_a_reset_survives_a_newer_upsert_and_a_retry_but_not_a_remove() -> None:
    q = _q(backoff_s=0.1)
    q.put("n1", "remove", now=0.0, remove=True)
    q.put("n1", "u1", now=0.0)
    q.put("n1", "u2", now=0.0)  # still must forget the old incarnation
    r = q.poll(0.0)
    assert isinstance(r, list) and [(e.item, e.reset) for e in r] == [("u2", True)]
    due, _ = q.failed(0.0)
    r = q.poll(due)
    assert isinstance(r, list) and [(e.item, e.reset, e.tried) for e in r] == [("u2", True, 1)]
    q.sent(due)
    q.put("n1", "remove", now=1.0, remove=True)
    q.put("n1", "remove2", now=1.0, remove=True)
    r = q.poll(1.0)
    assert isinstance(r, list) and [(e.item, e.reset) for e in r] == [("remove2", False)]


def test_halt_keeps_what_is_queued_for_the_next_put() -> None:
    q = _q()
    q.put("n1", "a", now=0.0)
    q.poll(0.0)
    q.put("n2", "b", now=0.1)  # in flight
    q.halt()  # the driver was cancelled: "a" is lost
    assert q.idle and len(q) == 1
    assert q.put("n3", "c", now=2.0) == 2.0  # an urgent one was queued
    assert _batch(q.poll(2.0)) == [("n2", "b"), ("n3", "c")]


def test_each_message_waits_no_longer_than_its_own_allowance() -> None:
    q = _q()
    assert q.put("n1", "refresh", now=0.0, wait_s=1.0) == 1.0
    # A start the owner counts may wait 0.5 s: the queue goes at 0.7.
    assert q.put("n2", "covered", now=0.2, wait_s=0.5) == pytest.approx(0.7)
    assert q.put("n3", "late", now=0.3, wait_s=1.0) is None  # due at 0.7 already
    assert q.poll(0.5) == pytest.approx(0.7)
    assert _batch(q.poll(0.7)) == [("n1", "refresh"), ("n2", "covered"), ("n3", "late")]


def test_a_replacing_message_keeps_the_earlier_deadline() -> None:
    q = _q()
    assert q.put("n1", "s1", now=0.0, wait_s=2.0) == 2.0
    # A newer status of the node, itself allowed to wait 2 s: the first
    # one's promise holds (it must not be pushed back to 3.5).
    assert q.put("n1", "s2", now=1.5, wait_s=2.0) is None
    assert q.poll(1.9) == 2.0
    r = q.poll(2.0)
    assert _batch(r) == [("n1", "s2")]
    assert isinstance(r, list) and r[0].wait_s == 2.0 and not r[0].urgent


def test_a_retry_waits_its_allowance_again_after_the_backoff() -> None:
    q = _q(backoff_s=0.1)
    q.put("n1", "covered", now=0.0, wait_s=0.5)
    q.put("n2", "refresh", now=0.0, wait_s=1.0)
    assert _batch(q.poll(0.5)) == [("n1", "covered"), ("n2", "refresh")]
    due, lost = q.failed(0.5)
    assert due == pytest.approx(0.6) and lost == []
    assert q.poll(due) == pytest.approx(1.1)  # the earliest: 0.6 + 0.5
    assert [e.node_id for e in q.poll(1.1)] == ["n1", "n2"]  # type: ignore[union-attr]


def test_after_a_halt_what_stayed_queued_keeps_its_deadline() -> None:
    q = _q()
    q.put("n1", "a", now=0.0, wait_s=0.5)
    q.put("n2", "b", now=0.0, wait_s=0.5)
    assert q.poll(0.5) is not None
    q.put("n3", "c", now=0.6, wait_s=5.0)  # in flight: waits for the next call
    q.halt()
    # A later put finds the queue idle: n3's deadline (5.6) counts, not
    # only the new message's.
    assert q.put("n4", "d", now=1.0, wait_s=10.0) == pytest.approx(5.6)


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError):
        OutboxQueue(batch=0)
    with pytest.raises(ValueError):
        _q().put("n1", "a", now=0.0, wait_s=-1.0)
    q = _q()
    with pytest.raises(RuntimeError):
        q.sent(0.0)
    q.put("n1", "a", now=0.0)
    q.poll(0.0)
    with pytest.raises(RuntimeError):
        q.poll(0.0)
