"""Each baseline shows its characteristic behaviour."""

import pytest

from simulator import workload as wl
from simulator.baselines.atoll import AtollModel
from simulator.runner import run_one
from simulator.system import Env, SimConfig

SMALL = {"cpu_millis": 10, "memory_mib": 16, "cold_start_s": 0.0}


def test_knative_central_scheduler_bound_shows_up_as_queueing(cal):
    # 400 cold requests at once; the rest of the chain made fast, the
    # scheduler at 100 pods/s. (KPA at target utilization 0.7 asks for two
    # pods per concurrent request of a concurrency-1 function.)
    w = wl.flood(400, 1e6, 400, 20.0, seed=1, **SMALL)
    cfg = SimConfig(nodes=50, params={"knative": {"serving_s": 1e-4, "write_s": 1e-4}})
    r = run_one("knative", w, cfg, cal)
    s, pods = r["scheduling_latency_s"], r["counts"]["placements"]
    assert pods >= 400
    assert r["throughput"]["scale_up_rate_per_s"] == pytest.approx(100, rel=0.1)
    # The pods queue at the one scheduler: the last of the first 400 waits
    # ~4 s, pods asked later wait behind them.
    assert s["p50"] > 1.0 and s["max"] >= 0.9 * (pods / 100 - 2.0)


def test_knative_default_chain_is_about_2_5_cold_starts_per_second(cal):
    w = wl.flood(60, 1e6, 60, 30.0, seed=1, **SMALL)
    r = run_one("knative", w, SimConfig(nodes=20), cal)
    assert r["throughput"]["scale_up_rate_per_s"] == pytest.approx(2.5, rel=0.1)


def test_sparrow_probes_two_nodes_per_task(cal):
    w = wl.flood(300, 200.0, 300, 10.0, seed=2, **SMALL)
    r = run_one("sparrow", w, SimConfig(nodes=100), cal)
    n = r["counts"]
    assert n["placements"] == 300
    assert n["probes"] == 2 * n["scale_ups"] == 600
    # Late binding: every task but one per reservation pair is a no-op reply.
    assert n["noop_replies"] == n["probes"] - n["placements"]


def test_ray_spills_only_above_half_utilisation(cal):
    # Nodes hold 10 instances: local placement until a node is half full.
    few = wl.flood(40, 50.0, 40, 10.0, seed=3, cpu_millis=400, memory_mib=16, cold_start_s=0.0)
    r = run_one("ray", few, SimConfig(nodes=40), cal)
    assert r["counts"].get("spills", 0) == 0  # about one per node: all local
    many = wl.flood(300, 50.0, 300, 20.0, seed=3, cpu_millis=400, memory_mib=16, cold_start_s=0.0)
    r = run_one("ray", many, SimConfig(nodes=40), cal)
    assert r["counts"]["spills"] > 0 and r["counts"]["placements"] == 300


def test_atoll_load_balancer_sees_every_request_and_pools_scale_out(cal):
    w = wl.flood(400, 1e4, 4, 10.0, seed=4, cpu_millis=1000, memory_mib=16, cold_start_s=0.0)
    env = Env(SimConfig(nodes=80), cal, w, 1)
    m = AtollModel(env)
    m.start()
    env.sim.run(w.duration_s, w.batches(), m.request)
    assert m.lb.ops == 400  # level one: every request passes the one load balancer
    n = env.rec.counts
    # One function's home pool (10 nodes x 4 instances) cannot hold its 100
    # requests: the application gets more SGSs, up to the whole cluster (320).
    assert n["sgs_scale_outs"] > 0 and n["placements"] == 320
    assert len(env.rec.dispatch) == 320


def test_atoll_sgs_pays_its_createinstance_calls_like_every_placer(cal):
    """Each placement costs the SGS that made it both halves of its
    CreateInstance call (as Galaxy's Schedule pays them), the reply before
    the instance takes requests."""
    w = wl.flood(200, 50.0, 200, 20.0, seed=5, **SMALL)
    env = Env(SimConfig(nodes=40), cal, w, 1)
    m = AtollModel(env)
    calls = {"create": 0}
    draw = m.s_create

    def counted() -> float:
        calls["create"] += 1
        return draw()

    m.s_create = counted
    m.start()
    env.sim.run(w.duration_s, w.batches(), m.request)
    placed = env.rec.counts["placements"]
    assert placed == 200 == env.rec.counts["instances_started"]
    assert calls["create"] == 2 * placed  # the send and the reply
    assert len(env.rec.dispatch) == 200  # every request served once routable


def test_platform_cpu_is_counted_for_cpu_models_only(cal):
    """Knative-like stations stand for fitted latencies, not CPU: no platform
    CPU is reported for it (the tables say n/a); CPU models report theirs."""
    from simulator.studies import _cpu_per_start

    w = wl.flood(40, 100.0, 10, 5.0, seed=3, **SMALL)
    cfg = SimConfig(nodes=20, seed=3)
    kn = run_one("knative", w, cfg, cal)
    sp = run_one("sparrow", w, cfg, cal)
    assert "cpu_s.platform" not in kn["sums"] and _cpu_per_start(kn) == "n/a"
    assert sp["sums"]["cpu_s.platform"] > 0 and _cpu_per_start(sp) != "n/a"
