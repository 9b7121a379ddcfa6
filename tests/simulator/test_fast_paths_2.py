"""More simulator fast paths against the plain code: node status messages,
the NodeInfo a heartbeat carries to ModNode, the cached Dispatch owners,
the sort of the latency samples, stations' Lindley recursion."""

from __future__ import annotations

import heapq
import random
from array import array

import pytest

from controlplane.runtime.compiled import is_compiled
from controlplane.runtime.resources import Res
from functions.schedule.service import node_info
from galaxy.v1 import common_pb2
from simulator import frontend, metrics
from simulator import workload as wl
from simulator.cluster import SimNode
from simulator.engine import Station
from simulator.galaxy import control
from simulator.galaxy.control import ControlPlane
from simulator.runner import run_one
from simulator.system import SimConfig


def plain_status(n: SimNode) -> common_pb2.NodeStatus:
    return common_pb2.NodeStatus(
        node_id=n.id,
        address=n.address,
        capacity=n.cap.capacity.to_proto(),
        allocated=n.cap.allocated.to_proto(),
        instances=len(n.cap),
        seq=n.seq,
    )


def test_node_status_is_the_message_built_from_keywords():
    rng = random.Random(1)
    node = SimNode(7, Res(4000, 8192, 1), Station("agent"), 8)
    for i in range(300):
        need = Res(rng.choice([250, 500, 1000]), rng.choice([128, 1024]), rng.choice([0, 0, 1]))
        if node.cap.fits(need) and rng.random() < 0.6:
            node.cap.allocate(f"i{i}", need)
        elif len(node.cap):
            node.cap.free(rng.choice(list(node.cap)))
        node.seq += 1
        a, b = node.status(), plain_status(node)
        assert a == b
        assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
        assert node_info(a) == node.info()
    # Out of uint32 range (never on a real node): clamped as Res.to_proto does.
    object.__setattr__(node.cap, "_allocated", Res(-5, 2**33, 0))
    assert node.status() == plain_status(node)


@pytest.mark.skipif(is_compiled(control), reason="patches a class of the compiled build")
def test_heartbeats_carry_what_modnode_would_convert(cal, monkeypatch):
    seen = []
    orig = ControlPlane.apply_modnode

    def check(self, a):
        _, status, info = a
        seen.append(info is None or info == node_info(status))
        orig(self, a)

    monkeypatch.setattr(ControlPlane, "apply_modnode", check)
    w = wl.poisson(100.0, 10.0, n_functions=8, mean_duration_s=0.5, seed=5)
    r = run_one("galaxy", w, SimConfig(nodes=30, seed=5), cal)
    assert r["counts"]["placements"] > 0 and len(seen) > 50 and all(seen)


@pytest.mark.skipif(is_compiled(frontend), reason="patches a class of the compiled build")
def test_cached_dispatch_owners_follow_the_membership(cal, monkeypatch):
    # Dispatch instances are added and removed by the controller during this
    # run: the Frontend's cached owner must always be the current owner's.
    from simulator.frontend import Frontend

    checked = []
    orig = Frontend.request

    def request(self, fn, duration):
        st = self.owners[fn]
        if st is not None:
            checked.append(st is self.owner(fn))
        orig(self, fn, duration)

    monkeypatch.setattr(Frontend, "request", request)
    from simulator.galaxy import model as gm

    orig_init, orig_start = gm.GalaxyModel.__init__, gm.GalaxyModel.start

    def init(self, env, cfg=None, **kw):
        orig_init(self, env, cfg, **kw)
        self.request = self.front.request  # the wrapped one

    def start(self):
        orig_start(self)
        for t, f in ((2.0, self.control.add), (4.0, self.control.add), (6.0, self.control.remove)):
            self.sim.at(t, lambda _, f=f: f("dispatch"))

    monkeypatch.setattr(gm.GalaxyModel, "__init__", init)
    monkeypatch.setattr(gm.GalaxyModel, "start", start)
    w = wl.poisson(300.0, 10.0, n_functions=30, mean_duration_s=0.05, seed=6)
    r = run_one("galaxy", w, SimConfig(nodes=30, seed=6), cal)
    assert r["counts"]["control_added.dispatch"] == 2
    assert r["counts"]["control_removed.dispatch"] == 1
    assert len(checked) > 1000 and all(checked)


@pytest.mark.parametrize("seed", range(4))
def test_sorted_samples_as_python_sorts_them(seed):
    rng = random.Random(seed)
    xs = array("d", (rng.choice([0.0, -0.0, 1e-3, rng.random()]) for _ in range(5000)))
    got = metrics._sorted(xs)
    want = array("d", sorted(xs))
    assert got.tobytes() == want.tobytes()  # -0.0 and 0.0 keep their order too
    # No zeros: the unstable (faster) sort, duplicates included.
    xs = array("d", (rng.choice([1e-3, 2.5e-4, rng.expovariate(9.0)]) for _ in range(5000)))
    assert metrics._sorted(xs).tobytes() == array("d", sorted(xs)).tobytes()
    with_nan = array("d", [3.0, float("nan"), 1.0])
    assert metrics._sorted(with_nan).tobytes() == array("d", sorted(with_nan)).tobytes()


@pytest.mark.parametrize("c", [1, 3])
def test_station_finish_is_lindleys_recursion(c):
    rng = random.Random(c)
    st = Station("s", c=c)
    free = [0.0] * c
    t = 0.0
    for _ in range(2000):
        t += rng.expovariate(1000.0)
        service = rng.expovariate(800.0 * c)
        start = max(t, free[0])
        done = start + service
        heapq.heapreplace(free, done)
        assert st.finish(t, service) == done
    assert st.ops == 2000


@pytest.mark.parametrize("fold", [100, 1 << 16])
@pytest.mark.parametrize("seed", range(4))
def test_arrivals_and_completions_binned_as_one_by_one(seed, fold, monkeypatch):
    monkeypatch.setattr(metrics, "_FOLD", fold)  # held completions binned this many at a time
    rng = random.Random(seed)
    dur = rng.choice([10.0, 3600.0, 28800.0])
    rec = metrics.Recorder(dur)
    plain_arrived = [0] * len(rec._arrived)
    plain_completed = [0] * len(rec._completed)
    n = len(plain_arrived) - 1
    for _ in range(6):
        times = sorted(rng.uniform(0, dur * 1.2) for _ in range(rng.randint(0, 2000)))
        times += [0.0, dur, dur * 5, 1e300][: rng.randint(0, 4)]
        rec.arrived(times)
        for t in times:
            i = int(t / rec.bin_s)
            plain_arrived[i if i < n else n] += 1
            rec.completed(t)
            plain_completed[i if i < len(plain_completed) else -1] += 1
    assert rec._arrived == plain_arrived
    s = rec.summary(dur)
    assert rec._completed == plain_completed and rec.n_completed == sum(plain_completed)
    assert s["series"]["completed"] == plain_completed[: len(s["series"]["completed"])]
    assert all(type(x) is int for x in rec._arrived + rec._completed)
    # Negative times (never in a run) take the one-by-one path: same bins.
    rec2 = metrics.Recorder(100.0)
    rec2.arrived([-1.0, -2.5, 3.0])
    want = [0] * len(rec2._arrived)
    for t in (-1.0, -2.5, 3.0):
        want[int(t / rec2.bin_s)] += 1
    assert rec2._arrived == want


@pytest.mark.parametrize("seed", range(6))
def test_events_run_in_time_then_scheduling_order(seed):
    # The float heap and the dict of events give the order of (time, seq)
    # tuples on a heap: equal times (many here) in the order scheduled,
    # including events scheduled while others at that time run.
    from simulator.engine import Sim

    rng = random.Random(seed)
    sim = Sim()
    ran: list[tuple[float, int]] = []
    plain: list[tuple[float, int, int]] = []  # (t, seq, id): sorted = the order
    serial = [0]

    def schedule(t: float) -> None:
        serial[0] += 1
        plain.append((t, serial[0], serial[0]))
        sim.at(t, fire, serial[0])

    def fire(i: int) -> None:
        ran.append((sim.now, i))
        for _ in range(rng.choice([0, 1, 1, 2, 2])):
            if len(plain) < 3000:
                schedule(sim.now + rng.choice([0.0, 0.0, 0.5, 1.0, rng.random()]))

    for _ in range(50):
        schedule(rng.choice([0.0, 1.0, 2.0, rng.random() * 3]))
    sim.run()
    want = [(t, i) for t, _, i in sorted(plain)]
    assert ran == want and sim.pending() == 0
    assert len(ran) > 500 and len({t for t, _ in ran}) < len(ran)  # ties happened
