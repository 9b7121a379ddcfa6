"""Start backoff (functions/dispatch/backoff.py) on a manual clock: after
``after`` failures in a row, exponential periods up to the cap; one step per
period however many starts fail in it; a success or a new spec version ends
it; the tracked functions are bounded."""

from __future__ import annotations

from controlplane.runtime.clock import ManualClock
from functions.dispatch.backoff import BackoffConfig, StartBackoff, Step

CFG = BackoffConfig(after=2, base_s=1.0, factor=2.0, cap_s=5.0)


def test_periods_double_up_to_the_cap() -> None:
    clock = ManualClock()
    b = StartBackoff(CFG, clock)
    assert b.failed("f", 1, "exit 1") is None  # one failure: no backoff yet
    assert b.blocked("f", 1) is None
    delays = []
    for _ in range(5):
        step = b.failed("f", 1, "process exited with code 1")
        assert isinstance(step, Step)
        delays.append(step.delay_s)
        blocked = b.blocked("f", 1)
        assert blocked is not None and blocked.failures == step.failures
        clock.advance(step.delay_s)
        assert b.blocked("f", 1) is None  # the next attempt may go
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_one_step_per_period_and_the_latest_error() -> None:
    clock = ManualClock()
    b = StartBackoff(CFG, clock)
    b.failed("f", 1, "a")
    step = b.failed("f", 1, "b")
    assert step is not None and step.failures == 2
    clock.advance(0.5)
    # Starts begun before the period that fail in it add no step.
    assert b.failed("f", 1, "c") is None and b.failed("f", 1, "d") is None
    f = b.blocked("f", 1)
    assert f is not None and f.failures == 2 and f.error == "d"
    msg = f.message("f", clock.now())
    assert msg == "function f: its last 2 starts failed; next attempt in 0.5s; last error: d"


def test_success_or_a_new_version_ends_it() -> None:
    clock = ManualClock()
    b = StartBackoff(CFG, clock)
    b.failed("f", 1, "x")
    b.failed("f", 1, "x")
    assert b.blocked("f", 1) is not None
    assert b.blocked("f", 2) is None  # redeployed: the fix is tried at once
    assert b.failed("f", 2, "y") is None  # and counts from one
    state = b.state("f")
    assert state is not None and (state.version, state.failures) == (2, 1)
    b.succeeded("f")
    assert b.state("f") is None and b.blocked("f", 2) is None


def test_a_full_cluster_is_not_the_functions_fault() -> None:
    b = StartBackoff(CFG, ManualClock())
    for _ in range(5):
        assert b.failed("f", 1, "no node has room", "RESOURCE_EXHAUSTED") is None
    assert b.state("f") is None and b.blocked("f", 1) is None
    b.failed("f", 1, "exit 1", "UNAVAILABLE")
    assert b.failed("f", 1, "bad checksum", "FAILED_PRECONDITION") is not None


def test_tracked_functions_are_bounded() -> None:
    b = StartBackoff(BackoffConfig(max_functions=3), ManualClock())
    for i in range(5):
        b.failed(f"f{i}", 1, "x")
    assert [b.state(f"f{i}") is not None for i in range(5)] == [False, False, True, True, True]
