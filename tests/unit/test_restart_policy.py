"""`galaxy up`'s restart policy: backoff, reset after a healthy run, budget."""

from __future__ import annotations

from controlplane.launch.restart import RestartPolicy


def test_quick_deaths_back_off_and_a_healthy_run_resets() -> None:
    p = RestartPolicy(base_s=0.2, cap_s=1.0, healthy_s=30.0, budget=10, window_s=60.0)
    p.started("schedule-0", 0.0)
    delays = []
    t = 0.0
    for _ in range(4):
        t += 1.0
        d = p.on_exit("schedule-0", t)
        assert d is not None
        delays.append(d)
        p.started("schedule-0", t + d)
    assert delays == [0.2, 0.4, 0.8, 1.0]  # doubling, capped
    assert p.on_exit("schedule-0", t + 100.0) == 0.2  # it ran 100 s: start over


def test_a_crash_loop_spends_the_budget() -> None:
    p = RestartPolicy(base_s=0.1, budget=3, window_s=10.0)
    p.started("agent-0", 0.0)
    assert [p.on_exit("agent-0", float(t)) is not None for t in (1, 2, 3, 4)] == [
        True, True, True, False,
    ]  # fmt: skip
    assert p.restarts("agent-0") == 3
    # Old restarts leave the window; other children have budgets of their own.
    assert p.on_exit("agent-0", 20.0) is not None
    assert p.on_exit("agent-1", 4.0) is not None
