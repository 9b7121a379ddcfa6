"""The Galaxy model drives the production policy objects: if it stops
calling them, these counts drop and the test fails."""

import functools

import pytest

from controlplane.controller import scaling
from controlplane.nodeagent.capacity import NodeCapacity
from controlplane.runtime import rendezvous
from controlplane.runtime.compiled import is_compiled
from functions.clustermgr.forwarding import HeartbeatForwarding
from functions.clustermgr.policy import NodeRegistry
from functions.dispatch import credits, policy
from functions.dispatch.autoscaling import kpa
from functions.dispatch.policy import FunctionRouter
from functions.schedule.policy import PlacementPolicy
from simulator import workload as wl
from simulator.galaxy import placement
from simulator.runner import run_one
from simulator.system import SimConfig

CALLED = [
    (FunctionRouter, "acquire"),
    (FunctionRouter, "release"),
    (FunctionRouter, "scale_ups_needed"),
    (FunctionRouter, "scale_up_done"),
    (PlacementPolicy, "advance"),
    (PlacementPolicy, "record_probe"),
    (PlacementPolicy, "confirm"),
    (PlacementPolicy, "upsert"),
    (NodeRegistry, "update"),
    (HeartbeatForwarding, "wait_s"),
    (NodeCapacity, "allocate"),
    (kpa.KpaAutoscaler, "decide"),
]


def count_calls(monkeypatch, seen, methods):
    """Wrap each (class, method name) so that its calls are counted in seen."""
    for cls, name in methods:
        orig = getattr(cls, name)

        def wrap(orig=orig, key=f"{cls.__name__}.{name}"):
            @functools.wraps(orig)
            def f(*a, **k):
                seen[key] = seen.get(key, 0) + 1
                return orig(*a, **k)

            return f

        monkeypatch.setattr(cls, name, wrap())


@pytest.fixture
def counts(monkeypatch):
    seen: dict[str, int] = {}
    count_calls(monkeypatch, seen, CALLED)
    for mod, name in ((rendezvous, "owner"), (scaling, "decide")):
        orig = getattr(mod, name)

        def wrapf(orig=orig, key=f"{mod.__name__}.{name}"):
            def f(*a, **k):
                seen[key] = seen.get(key, 0) + 1
                return orig(*a, **k)

            return f

        monkeypatch.setattr(mod, name, wrapf())
    return seen


@pytest.mark.skipif(is_compiled(policy), reason="counts calls by patching compiled classes")
def test_galaxy_model_calls_the_production_policies(counts, cal):
    w = wl.poisson(100.0, 20.0, n_functions=8, mean_duration_s=0.5, seed=2)
    # Without credits every placement goes through Schedule's policy (the
    # credit path is checked below).
    r = run_one("Gn-CPE", w, SimConfig(nodes=40, seed=2), cal)
    n = r["counts"]
    # One routing decision per request (all were served: no warmup, no backlog).
    assert counts["FunctionRouter.acquire"] == r["dispatch_latency_s"]["count"]
    assert counts["FunctionRouter.release"] == n["completed"]
    assert counts["FunctionRouter.scale_up_done"] == n["instances_started"] > 0
    assert counts["PlacementPolicy.confirm"] == n["placements"] == n["instances_started"]
    assert counts["PlacementPolicy.advance"] >= n["placements"]
    # Exact partitions: a probe only for a node in doubt (after a refusal).
    assert counts.get("PlacementPolicy.record_probe", 0) == n.get("probes", 0)
    assert n.get("probes", 0) <= 2 * n.get("rejections", 0)
    assert counts["NodeCapacity.allocate"] == n["instances_started"]
    assert counts["NodeRegistry.update"] > 0 and counts["PlacementPolicy.upsert"] >= 40
    # Every recorded beat asks production's rule what goes on, and how soon.
    assert 0 < counts["HeartbeatForwarding.wait_s"] <= counts["NodeRegistry.update"]
    assert counts["KpaAutoscaler.decide"] > 0
    assert counts["controlplane.controller.scaling.decide"] >= 19  # one per report period
    assert counts["controlplane.runtime.rendezvous.owner"] > 0


def test_probe_cache_switch_reaches_the_policy(cal):
    w = wl.poisson(200.0, 10.0, n_functions=20, mean_duration_s=0.5, seed=3)
    cfg = SimConfig(nodes=40, seed=3)
    on = run_one("Gn-CP", w, cfg, cal)["counts"]
    off = run_one("Gn-C", w, cfg, cal)["counts"]
    exact = run_one("Gn-CPE", w, cfg, cal)["counts"]
    assert off["probes"] == pytest.approx(2 * off["placements"], rel=0.02)  # d = 2, always
    assert on["probes"] < 0.6 * off["probes"]
    # Exact partitions: no probe unless a node agent refused a reservation.
    assert exact["placements"] > 0
    assert exact.get("probes", 0) <= 2 * exact.get("rejections", 0) < 0.1 * on["probes"]


@pytest.mark.skipif(is_compiled(credits), reason="counts calls by patching a compiled class")
def test_credit_path_drives_the_production_wallet_and_ledger(monkeypatch, cal):
    """Full Galaxy: every scale-up asks the Dispatch instance's
    ``CreditWallet``; hits skip Schedule; the Schedule instances'
    ``CreditLedger`` grants and takes reports; a node never over-commits."""
    from functions.dispatch.credit_demand import CreditDemand
    from functions.dispatch.credits import CreditWallet
    from functions.schedule.credits import CreditLedger

    seen: dict[str, int] = {}
    count_calls(
        monkeypatch,
        seen,
        ((CreditWallet, "take"), (CreditLedger, "sync"), (CreditDemand, "took")),
    )
    w = wl.poisson(100.0, 20.0, n_functions=8, mean_duration_s=0.5, seed=2)
    r = run_one("galaxy", w, SimConfig(nodes=40, seed=2), cal)
    n = r["counts"]
    assert seen["CreditWallet.take"] == n["scale_ups"] == n["credit_hits"] + n["credit_misses"]
    # How many credits to hold is production's demand rule, told of every take.
    assert seen["CreditDemand.took"] == n["scale_ups"]
    assert n["credit_hits"] > 0.8 * n["scale_ups"]  # credits serve most starts
    # Every exchange sent reaches a ledger (but those in flight at the end).
    assert seen["CreditLedger.sync"] > 0
    assert 0 <= n["credit_syncs"] - seen["CreditLedger.sync"] <= 4
    assert n["instances_started"] == n["scale_ups"]
    # Off: no credit path at all.
    off = run_one("Gn-CPE", w, SimConfig(nodes=40, seed=2), cal)["counts"]
    assert "credit_hits" not in off
    # About as many starts (the KPA decides them; the paths' timings differ).
    assert abs(off["instances_started"] - n["instances_started"]) <= 0.02 * n["instances_started"]


def test_ablation_variants_order_scheduling_latency(cal):
    w = wl.poisson(100.0, 10.0, n_functions=20, mean_duration_s=0.5, seed=4)
    cfg = SimConfig(nodes=40, seed=4)
    p50 = {v: run_one(v, w, cfg, cal)["scheduling_latency_s"]["p50"] for v in ("Gn", "Gn-C")}
    assert p50["Gn-C"] < p50["Gn"]  # the connection cache removes channel set-up


@pytest.mark.skipif(is_compiled(placement), reason="patches a method of a compiled class")
def test_probe_answers_queue_behind_work_already_waiting_in_schedule(cal):
    """A probe's answers are a new message to Schedule: they wait for the
    work queued there before them (they do not jump the queue)."""
    from simulator.galaxy import GalaxyModel
    from simulator.galaxy.control import ScheduleInst
    from simulator.galaxy.placement import ScaleUp
    from simulator.system import Env
    from simulator.workload import Workload, functions

    fns = functions(1, "cold", cpu_millis=10, memory_mib=16, cold_start_s=0.0)
    env = Env(SimConfig(nodes=4), cal, Workload("t", fns, 10.0, lambda: iter(())), 1)
    model = GalaxyModel(env, instances=1, controller_scaling=False)
    sf = next(iter(model.control.sfs.values()))
    assert isinstance(sf, ScheduleInst)
    recorded: list[float] = []
    model.placer._record = lambda su: recorded.append(env.sim.now)  # type: ignore[method-assign]
    su = ScaleUp(model.control.dispatch_owner(0), 0, 0.0)
    su.sf = sf
    backlog_end = sf.station.finish(0.0, 0.05)  # 50 ms of work already queued
    env.sim.at(0.001, model.placer._answers, su)
    env.sim.run(1.0)
    assert recorded and recorded[0] >= backlog_end


@pytest.mark.parametrize("standby", [0, 1])
def test_a_warm_standby_joins_at_once_and_is_replaced(cal, standby):
    from simulator.galaxy import GalaxyModel
    from simulator.system import Env
    from simulator.workload import Workload, functions

    fns = functions(1, "cold", cpu_millis=10, memory_mib=16, cold_start_s=0.0)
    env = Env(SimConfig(nodes=4), cal, Workload("t", fns, 10.0, lambda: iter(())), 1)
    model = GalaxyModel(env, instances=1, controller_scaling=False, standby=standby)
    cp = model.control
    cp.add("schedule")
    # Promoted: a member now; started: only once its process is up.
    assert len(cp.sfs) == 1 + standby
    assert cp.standby["schedule"] == 0
    env.sim.run(cp.start_s + 0.01)
    assert len(cp.sfs) == 2
    assert cp.standby["schedule"] == standby  # the replacement is ready


def test_waiters_past_the_dispatch_bound_fail_as_production_refuses_them(cal):
    """Production Dispatch refuses a request past ``max_queue`` waiters
    (RESOURCE_EXHAUSTED); the model's routers have the same bound and count
    each refusal."""
    from functions.dispatch.config import DispatchConfig
    from simulator.galaxy import GalaxyModel
    from simulator.system import Env
    from simulator.workload import Workload, functions

    fns = functions(1, "cold", cpu_millis=10, memory_mib=16, cold_start_s=5.0)
    env = Env(SimConfig(nodes=4), cal, Workload("t", fns, 10.0, lambda: iter(())), 1)
    model = GalaxyModel(env, instances=1, controller_scaling=False)
    # On the instance: a class of the compiled build shows its attributes'
    # descriptors, not their defaults.
    assert model.max_queue == DispatchConfig().max_queue
    model.max_queue = 3  # a small bound, so a handful of requests pass it
    model.start()
    for i in range(10):  # once the nodes are known, within the first start
        env.sim.at(2.0 + 0.001 * i, lambda _: model.request(0, 0.01), None)
    env.sim.run(3.0)
    router = model.front.routers[0]
    assert router is not None and len(router.waiters) == 3
    assert model.rec.counts["failed.queue_full"] == 7


def test_a_wait_past_the_dispatch_timeout_fails_as_production_refuses_it(cal):
    """Production Dispatch refuses a request that waited its timeout
    (``functions.dispatch.waits``); the model's waiters time out by the same
    rule and each one is counted, once, and never also served."""
    from functions.dispatch.config import DispatchConfig
    from functions.dispatch.waits import wait_timeout_s
    from simulator.galaxy import GalaxyModel
    from simulator.system import Env
    from simulator.workload import Workload, functions

    fns = functions(1, "cold", cpu_millis=10, memory_mib=16, cold_start_s=5.0)
    env = Env(SimConfig(nodes=4), cal, Workload("t", fns, 10.0, lambda: iter(())), 1)
    model = GalaxyModel(env, instances=1, controller_scaling=False)
    assert model.wait_s == wait_timeout_s(None, DispatchConfig().lease_ttl_ms / 1000.0)
    model.front.wait_s = 1.0  # shorter than the cold start
    model.start()
    for i in range(4):  # once the nodes are known
        env.sim.at(2.0 + 0.001 * i, lambda _: model.request(0, 0.01), None)
    env.sim.at(6.5, lambda _: model.request(0, 0.01), None)  # after the start: served
    env.sim.run(9.0)
    assert model.rec.counts["failed.wait_timeout"] == 4
    assert model.rec.n_completed == 1
