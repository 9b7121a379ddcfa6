"""The asyncio event-loop model of a process (simulator.loop)."""

import pytest

from simulator.engine import Sim, Station
from simulator.loop import EventLoop


def make(request_steps=5, reply_steps=4):
    sim = Sim()
    st = Station("p")
    st.loop = EventLoop(sim, st, request_steps, reply_steps)
    done: dict[str, float] = {}
    return sim, st, done, lambda name: lambda _: done.__setitem__(name, sim.now)


def test_calls_on_an_idle_loop_cost_their_cpu_and_keep_their_order():
    sim, st, done, mark = make()
    for i in range(3):
        sim.stage(0.0, st, 0.001, mark(f"c{i}"), None)
    sim.run()
    # Accepted one per iteration, each handler one iteration after the last:
    # nothing else runs, so they end one service time apart, as in FIFO.
    assert [done[f"c{i}"] for i in range(3)] == pytest.approx([0.001, 0.002, 0.003])
    assert st.busy == pytest.approx(0.003)
    assert st.loop is not None and st.loop.in_flight() == 0


def test_a_reply_overtakes_new_calls_waiting_to_be_accepted():
    sim, st, done, mark = make()
    for i in range(10):
        sim.stage(0.0, st, 0.001, mark(f"c{i}"), None)
    sim.reply(0.0, st, 0.0001, mark("reply"), None)
    sim.run()
    calls = sorted(done[f"c{i}"] for i in range(10))
    # A FIFO queue would serve the reply last, after 10 ms of calls.
    assert done["reply"] < calls[2]
    assert max(calls) == pytest.approx(0.0101)  # no CPU lost or invented


def test_a_message_waits_rounds_behind_work_in_flight():
    """Each of a reply's iterations runs behind one step of every task in
    flight, including work that arrived after it: FIFO would not make it
    wait for that."""
    sim, st, done, mark = make(request_steps=2, reply_steps=3)
    sim.stage(0.0, st, 0.001, mark("c1"), None)
    sim.stage(0.0, st, 0.001, mark("c2"), None)
    sim.reply(0.0005, st, 0.00001, mark("reply"), None)  # while c1's handler runs
    sim.stage(0.0006, st, 0.001, mark("c3"), None)  # after the reply
    sim.run()
    assert [done["c1"], done["c2"], done["c3"]] == pytest.approx([0.001, 0.002, 0.003])
    assert done["reply"] == pytest.approx(0.00301)  # behind c3's handler too
    fifo, t = Station("f"), 0.0
    for arrive, service in ((0.0, 0.001), (0.0, 0.001), (0.0005, 0.00001)):
        t = fifo.finish(arrive, service)
    assert t == pytest.approx(0.00201)  # FIFO: behind c1 and c2 only


def test_loop_steps_must_be_positive():
    sim = Sim()
    with pytest.raises(ValueError, match="at least one"):
        EventLoop(sim, Station("p"), 0, 1)


def test_fifo_stations_treat_replies_as_messages():
    sim = Sim()
    st = Station("p")
    seen: list[float] = []
    st.finish(0.0, 0.01)  # busy until 10 ms
    sim.reply(0.001, st, 0.001, lambda _: seen.append(sim.now), None)
    sim.run()
    assert seen == [pytest.approx(0.011)]


def test_processes_on_a_shared_host_get_event_loops_when_asked(cal):
    from simulator.system import Env, SimConfig
    from simulator.workload import Workload, functions

    w = Workload("t", functions(1, "f"), 1.0, lambda: iter(()))
    env = Env(SimConfig(nodes=4, host_cores=2, host_event_loops=True), cal, w, 1)
    assert all(a.loop is not None for a in env.cluster.agents)
    assert env.station("schedule-0").loop is not None
    for cfg in (SimConfig(nodes=4, host_cores=2), SimConfig(nodes=4, host_event_loops=True)):
        env = Env(cfg, cal, w, 1)  # not asked, or no shared host (a datacenter)
        assert env.station("x").loop is None and env.cluster.agents[0].loop is None
