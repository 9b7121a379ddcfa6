"""The event loop, stations and the M/M/c queue against its closed form."""

import math
import random

import pytest

from simulator.engine import SLACK_S, Progress, Sim, Station
from simulator.host import Host


def erlang_c_wait(lam: float, mu: float, c: int) -> float:
    """Mean wait in queue of M/M/c (Erlang C)."""
    a = lam / mu
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return p_wait / (c * mu - lam)


@pytest.mark.parametrize("c, rho", [(1, 0.7), (4, 0.8)])
def test_mmc_mean_wait_matches_erlang_c(c, rho):
    mu = 10.0
    lam = rho * c * mu
    rng = random.Random(5)
    t, times, services = 0.0, [], []
    for _ in range(200_000):
        t += rng.expovariate(lam)
        times.append(t)
        services.append(rng.expovariate(mu))
    sim, st = Sim(), Station("q", c=c)
    waits = []

    def arrive(fn: int, service: float) -> None:
        now = sim.now
        waits.append(st.finish(now, service) - service - now)

    sim.run(arrivals=iter([(times, [0] * len(times), services)]), on_arrival=arrive)
    measured = sum(waits[10_000:]) / len(waits[10_000:])
    assert measured == pytest.approx(erlang_c_wait(lam, mu, c), rel=0.06)
    assert sim.events == len(times)


def test_events_fire_in_time_then_schedule_order_and_until_stops():
    sim, seen = Sim(), []
    for t, name in ((2.0, "b"), (1.0, "a"), (2.0, "c"), (5.0, "late")):
        sim.at(t, seen.append, name)
    sim.run(until=3.0)
    assert seen == ["a", "b", "c"] and sim.now == 3.0 and sim.pending() == 1


def test_arrivals_merge_with_events():
    sim, seen = Sim(), []
    sim.at(1.5, lambda _: seen.append(("event", sim.now)))
    batches = iter([([1.0, 2.0], [7, 8], [0.1, 0.2]), ([], [], []), ([3.0], [9], [0.3])])
    sim.run(arrivals=batches, on_arrival=lambda f, d: seen.append((f, sim.now)))
    assert seen == [(7, 1.0), ("event", 1.5), (8, 2.0), (9, 3.0)]


def test_pipeline_hands_a_late_job_over_at_its_arrival():
    sim, st, done = Sim(), Station("s"), []
    far = 10 * SLACK_S
    sim.pipeline(far, [(st, 1.0, 0.0)], done.append, "late")
    # A job sent later but arriving earlier must not queue behind it.
    sim.at(0.0, lambda _: sim.pipeline(SLACK_S / 2, [(st, 0.001, 0.0)], done.append, "early"))
    sim.run()
    assert done == ["early", "late"]


def test_shared_host_runs_processes_on_its_cores():
    host = Host(1)
    a, b = Station("a", host=host), Station("b", host=host)
    assert a.finish(0.0, 1.0) == 1.0
    assert b.finish(0.0, 1.0) == 2.0  # one core: b waits although its own process is idle
    assert a.finish(0.5, 1.0) == 3.0  # ... and a's next job waits for the core too
    assert Station("c").finish(0.0, 1.0) == 1.0  # a dedicated process
    two = Host(2)
    x, y = Station("x", host=two), Station("y", host=two)
    assert x.finish(0.0, 1.0) == 1.0 and y.finish(0.0, 1.0) == 1.0
    assert x.finish(0.5, 1.0) == 2.0  # busy: continues on its own core


def test_progress_prints_only_for_long_runs(capsys):
    import io

    out = io.StringIO()
    p = Progress("x", 10.0, out=out, min_wall_s=0.0)
    p._last = -1e9
    p.update(5.0)
    p.update(10.0, final=True)
    assert "50.0%" in out.getvalue() and out.getvalue().endswith("\n")
    quiet = io.StringIO()
    Progress("y", 10.0, out=quiet).update(10.0, final=True)
    assert quiet.getvalue() == ""
