"""The simulator's models: sizes per function, node caches on production's
ModelIndex, load time by tier and link queue, warm-up, and a run with
models (locality on vs blind, and the default run untouched)."""

from __future__ import annotations

import pytest

from controlplane.runtime import warmup
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import ModelLocality, NodeInfo
from simulator.experiments import parse_workload
from simulator.models import MIXED, ModelSim, sizes_for
from simulator.runner import run_one
from simulator.system import SimConfig

BW = ModelLocality()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sizes_come_from_the_table_and_the_seed() -> None:
    a = sizes_for(500, "mixed", seed=1)
    assert a == sizes_for(500, "mixed", seed=1) != sizes_for(500, "mixed", seed=2)
    table = {name: size for name, size, _ in MIXED}
    assert all(table[name] == size for name, size in a)
    small = sum(size < 1_000_000_000 for _, size in a) / len(a)
    assert 0.7 < small < 0.95  # weights: 85% under 1 GB


def test_a_start_fetches_then_reads_from_disk_then_memory() -> None:
    clock = Clock()
    sim = ModelSim([("m", 1_000_000_000)], clock)
    size = 1_000_000_000
    first = sim.load_s("n0", 0)
    assert first == pytest.approx(size / BW.link_bps + size / BW.disk_bps)
    assert sim.info("n0", NodeInfo("n0", "a", Res())).models == {"model-0": ("fetching", size)}
    clock.now = first
    assert sim.load_s("n0", 0) == pytest.approx(size / BW.disk_bps)  # landed on disk
    assert sim.load_s("n0", 0) == pytest.approx(size / BW.memory_bps)  # copied up
    assert sim.info("n0", NodeInfo("n0", "a", Res())).models == {"model-0": ("memory", size)}


def test_fetches_queue_on_a_node_link_and_a_cacheless_start_always_fetches() -> None:
    clock = Clock()
    size = 500_000_000
    sim = ModelSim([("a", size), ("b", size)], clock)
    sim.load_s("n0", 0)
    second = sim.load_s("n0", 1)  # behind the first on the same link
    assert second == pytest.approx(2 * size / BW.link_bps + size / BW.disk_bps)
    other = ModelSim([("a", size)], clock)
    assert other.fetch_only("n1", 0) == pytest.approx(size / BW.link_bps)
    assert other.fetch_only("n1", 0) == pytest.approx(2 * size / BW.link_bps)  # no cache


def test_warm_up_to_10_of_210_nodes_avoids_busy_links_and_meets_the_floor() -> None:
    clock = Clock()
    size = 2_630_000_000
    sim = ModelSim([("opt", size), ("busy", 13_500_000_000)], clock)
    ids = [f"node-{i}" for i in range(210)]
    for nid in ids[:200]:  # 200 nodes are fetching a 13.5 GB model
        sim.load_s(nid, 1)
    infos = [sim.info(nid, NodeInfo(nid, "a", Res(4000, 8192), seq=1)) for nid in ids]
    want = sim.placing(0, "opt")
    plan = warmup.plan(infos, want, 10, Res(250, 256))
    chosen = [n.node_id for n in plan.fetch]
    assert sorted(chosen) == sorted(ids[200:])
    took = sim.warm(chosen, 0)
    floor = size / BW.link_bps
    assert took <= 1.2 * floor
    # The same warm-up on busy nodes waits for their queues.
    assert sim.warm(ids[:10], 0) > 5 * floor  # behind 108 s of queue each


@pytest.mark.slow
def test_locality_lowers_model_load_times_and_off_changes_nothing(cal) -> None:  # type: ignore[no-untyped-def]
    w = parse_workload("azure2019:minutes=3", 1)
    base = SimConfig(nodes=40, seed=1)
    on = SimConfig(
        nodes=40, seed=1, models="mixed", params={"galaxy": {"scoring": "model_locality"}}
    )
    blind = SimConfig(nodes=40, seed=1, models="mixed")
    r_on = run_one("galaxy", w, on, cal)
    r_blind = run_one("galaxy", w, blind, cal)
    p_on = r_on["extra_latency_s"]["model_load"]
    p_blind = r_blind["extra_latency_s"]["model_load"]
    assert p_on["p50"] < p_blind["p50"]
    assert "model_load" not in run_one("galaxy", w, base, cal)["extra_latency_s"]
