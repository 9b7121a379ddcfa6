"""The shared-machine model (``simulator.host.Host``): other work on the
machine, waking halted cores, and the kernel favouring a waking process."""

import pytest

from simulator.engine import Station
from simulator.host import Host


def _busy_share(background: float, cores: int = 1, jobs: int = 20_000) -> float:
    """The share of the machine a process that always has work gets."""
    host = Host(cores, slice_s=0.0015, seed=3, background=background)
    st = Station("busy", host=host)
    t = 0.0
    for _ in range(jobs):
        t = st.finish(t, 0.0001)  # the next job arrives as the last ends
    return jobs * 0.0001 / t


def test_background_processes_get_their_fair_share_of_a_busy_core():
    assert _busy_share(0.0) == pytest.approx(1.0)
    # One core, k other CPU-bound processes and ours: ours gets 1/(1 + k).
    assert _busy_share(0.5) == pytest.approx(1 / 1.5, abs=0.03)
    assert _busy_share(3.0) == pytest.approx(1 / 4, abs=0.03)
    # Two cores, one hog: it runs on the other core and ours keeps its own.
    assert _busy_share(1.0, cores=2) == pytest.approx(1.0)
    # Two cores, three hogs: ours gets its fair 2/4.
    assert _busy_share(3.0, cores=2) == pytest.approx(0.5, abs=0.03)


def test_background_must_be_a_count_of_processes():
    with pytest.raises(ValueError, match="background"):
        Host(2, background=-1.0)


def test_a_waking_process_waits_at_most_a_slice_for_background():
    slice_s = 0.0015
    host = Host(1, slice_s=slice_s, seed=5, background=0.9)
    st = Station("light", host=host)
    waits = []
    for i in range(2000):
        t = i * 0.01  # a request every 10 ms: the process sleeps in between
        waits.append(st.finish(t, 0.0001) - t - 0.0001)
    # A CPU hog yields to the sleeper at the end of its slice, at the latest
    # (plus rare time-slice preemptions, which ``preemption`` adds).
    assert sorted(waits)[int(0.95 * len(waits))] <= slice_s
    assert max(waits) > 0.0  # but it does wait sometimes


def test_a_halted_core_pays_the_wakeup_a_busy_one_does_not():
    host = Host(1, wakeup_s=0.0005)
    a = Station("a", host=host)
    assert a.finish(1.0, 0.001) == pytest.approx(1.0015)  # idle for 1 s: wake it
    # Arriving within the halt-poll window after the core's last job: the
    # core is still polling, no wake-up to pay.
    t = 1.0015 + Host.HALT_AFTER_S / 2
    assert a.finish(t, 0.001) == pytest.approx(t + 0.001)
    t = 2.0
    assert a.finish(t, 0.001) == pytest.approx(t + 0.0015)  # idle again: wake it


def test_a_light_process_goes_before_a_heavy_ones_queued_work():
    host = Host(1)
    heavy, light = Station("heavy", host=host), Station("light", host=host)
    t = 0.0
    for _ in range(10):  # heavy queues 10 ms of work at time 0
        t = heavy.finish(0.0, 0.001)
    assert t == pytest.approx(0.010)
    # At 2 ms heavy has run 2 ms, light nothing: the kernel runs light first
    # (lower vruntime) and heavy's remaining work ends later by light's job.
    done = light.finish(0.002, 0.0005)
    assert done == pytest.approx(0.0025)
    assert heavy.free_at == pytest.approx(0.0105)
    assert heavy.finish(0.003, 0.001) == pytest.approx(0.0115)


def test_then_runs_a_continuation_before_work_queued_behind_it():
    st = Station("s")
    first = st.finish(0.0, 0.001)
    st.finish(0.0005, 0.001)  # queued behind the first job
    # Right after the first job, its handler sends an RPC: that work runs
    # now, and the queued job ends later by it.
    assert st.then(first, 0.0002) == pytest.approx(0.0012)
    assert st.free_at == pytest.approx(0.0022)
    # With nothing queued it is an ordinary job.
    idle = Station("idle")
    assert idle.then(1.0, 0.001) == pytest.approx(1.001)


def test_each_thread_a_message_passes_through_must_get_a_core():
    def waits(handoffs: int, background: float) -> float:
        host = Host(2, slice_s=0.0015, seed=9, background=background, handoffs=handoffs)
        st = Station("p", host=host)
        total = 0.0
        for i in range(3000):
            t = i * 0.01
            total += st.finish(t, 0.0001) - t - 0.0001
        return total

    assert abs(waits(3, 0.0)) < 1e-9 and abs(waits(1, 0.0)) < 1e-9  # free cores: free hand-over
    assert waits(3, 1.5) > 1.5 * waits(1, 1.5) > 0.0  # busy cores: every thread waits
    with pytest.raises(ValueError, match="thread"):
        Host(1, handoffs=0)


def test_a_message_to_a_sleeping_process_costs_the_wake_cpu():
    host = Host(2, wake_cpu_s=0.0002)
    st = Station("p", host=host)
    # Idle for long: the job costs its service plus the wake-up CPU.
    assert st.finish(1.0, 0.001) == pytest.approx(1.0012)
    # Another message within the idle window: its threads are still awake.
    t = 1.0012 + Host.IDLE_AFTER_S / 2
    assert st.finish(t, 0.001) == pytest.approx(t + 0.001)
    assert st.busy == pytest.approx(0.0022)  # the wake-up is CPU the process used
    # A process whose per-job cost was measured whole pays no extra.
    harness = Station("load-generator", host=host)
    host.measured.add(harness)
    assert harness.finish(5.0, 0.001) == pytest.approx(5.001)
