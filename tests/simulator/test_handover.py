"""Dispatch handovers in the Galaxy model come from the production protocol
core (``functions.dispatch.ownership``) and are performed as events: the
instances (with their leases) reach the new owner before any held request
is forwarded, and no request is lost on the way."""

from __future__ import annotations

from typing import Any

import pytest

from functions.dispatch import ownership as own
from functions.dispatch.policy import FunctionRouter
from simulator import workload as wl
from simulator.calibration import Calibration
from simulator.galaxy import handover as ho
from simulator.galaxy import model as gm
from simulator.runner import run_one
from simulator.system import SimConfig


def test_handover_sends_instances_before_forwarding_and_loses_nothing(
    cal: Calibration, monkeypatch: Any
) -> None:
    sends: dict[tuple[str, int], tuple[int, int]] = {}
    delivered: dict[tuple[str, int], list[float]] = {}
    forwards: list[tuple[tuple[str, int], float, int]] = []
    orig_perform, orig_arrived = ho.Handovers.perform, ho.Handovers._arrived

    def perform(self: ho.Handovers, df: Any, actions: list[own.Action]) -> None:
        for a in actions:
            if isinstance(a, own.SendInstances):
                leases = sum(len(ls) for _, ls in a.instances)
                sends[(df.id, a.handover)] = (len(a.instances), leases)
            elif isinstance(a, own.ForwardWaiters):
                forwards.append(((df.id, a.handover), self.sim.now, len(a.waiters)))
        orig_perform(self, df, actions)

    def arrive(self: ho.Handovers, x: Any) -> None:
        delivered.setdefault((x[0].id, x[1].handover), []).append(self.sim.now)
        orig_arrived(self, x)

    monkeypatch.setattr(ho.Handovers, "perform", perform)
    monkeypatch.setattr(ho.Handovers, "_arrived", arrive)
    orig_start = gm.GalaxyModel.start

    models: list[gm.GalaxyModel] = []

    def start(self: gm.GalaxyModel) -> None:
        models.append(self)
        orig_start(self)
        c = self.control
        self.sim.at(2.0, lambda _: c.add("dispatch"))
        self.sim.at(4.0, lambda _: c.add("dispatch"))
        self.sim.at(6.0, lambda _: c.remove("dispatch"))

    monkeypatch.setattr(gm.GalaxyModel, "start", start)
    w = wl.poisson(300.0, 10.0, n_functions=30, mean_duration_s=0.05, seed=6)
    r = run_one("galaxy", w, SimConfig(nodes=30, seed=6), cal)
    assert r["counts"]["handovers"] == len(sends) > 0
    # Functions moved with instances, some of them with slots in use.
    assert sum(n for n, _ in sends.values()) > 0
    assert sum(leases for _, leases in sends.values()) > 0
    # Every handover ends by forwarding (possibly nobody), once, and only
    # after each of its instances reached the new owner.
    assert sorted(k for k, _, _ in forwards) == sorted(sends)
    for key, t, _ in forwards:
        assert len(delivered.get(key, [])) == sends[key][0]
        assert all(a <= t for a in delivered.get(key, []))
    # No request lost or stuck on the way: each one was answered or still
    # waits in a router at the end.
    front = models[0].front
    waiting = sum(len(x.waiters) for x in front.routers if x is not None)
    assert r["dispatch_latency_s"]["count"] + waiting == front.requests


@pytest.mark.slow
def test_max_scale_bounds_live_and_pending_across_handovers(
    cal: Calibration, monkeypatch: Any
) -> None:
    # A flood on functions of a small max_scale while Dispatch instances
    # are added: a new owner starts instances for the requests that reach it
    # before the old owner's instances do. Those take the place of its
    # starts under way (written off: they land draining and idle).
    over: list[tuple[str, int]] = []
    routers: dict[str, FunctionRouter] = {}
    for name in ("add_instance", "scale_up_done", "begin_scale_up"):
        orig = getattr(FunctionRouter, name)

        def checked(self: FunctionRouter, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            out = _orig(self, *a, **k)
            routers[self.name] = self  # the newest router of each function
            if self.live_count() + self.pending > self.max_scale:
                over.append((self.name, self.live_count() + self.pending))
            return out

        monkeypatch.setattr(FunctionRouter, name, checked)
    # 4,000 cold starts a second on 2,000 nodes, starting from one instance
    # of each: the controller adds Dispatch instances during the flood, and
    # functions move (seeded: the same runs).
    small = {"cpu_millis": 10, "memory_mib": 16, "cold_start_s": 0.0, "max_scale": 100}
    w = wl.flood(16000, 4000.0, 16, 24.0, seed=1, **small)
    cfg = SimConfig(nodes=2000, seed=1, params={"galaxy": {"instances": 1}})
    r = run_one("galaxy", w, cfg, cal)
    assert r["counts"]["handovers"] > 0
    assert over == []
    # Each request holds its instance to the end: none past max_scale.
    assert len(routers) == 16 and all(x.live_count() <= 100 for x in routers.values())


def test_a_handover_during_a_flood_starts_one_instance_per_request(
    cal: Calibration, monkeypatch: Any
) -> None:
    # Each request keeps its instance to the end, so exactly one start per
    # request is needed. Dispatch instances join mid-flood, while starts are
    # under way: the old owner keeps the waiters they cover (the new owner,
    # counting no start under way, would start instances for them again).
    orig_start = gm.GalaxyModel.start

    def start(self: gm.GalaxyModel) -> None:
        orig_start(self)
        c = self.control
        for t in (0.05, 0.1):
            self.sim.at(t, lambda _: c.add("dispatch"))

    monkeypatch.setattr(gm.GalaxyModel, "start", start)
    small = {"cpu_millis": 10, "memory_mib": 16, "cold_start_s": 0.0}
    w = wl.flood(3000, 20000.0, 64, 20.0, seed=1, **small)
    cfg = SimConfig(nodes=210, seed=1, params={"galaxy": {"controller_scaling": False}})
    r = run_one("galaxy", w, cfg, cal)
    c = r["counts"]
    assert c["handovers"] > 0
    assert c["instances_started"] == 3000
    assert c.get("instances_retired", 0) == 0
