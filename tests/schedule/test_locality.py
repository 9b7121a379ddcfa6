"""The model_locality scoring term: estimated load time by tier and fetch
queue, traded against least_loaded; and Schedule placing by it."""

from __future__ import annotations

import random

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import (
    MODELS_PER_NODE,
    ModelLocality,
    NodeInfo,
    Placing,
    least_loaded,
    lookup,
)
from functions.schedule.config import ScheduleConfig
from functions.schedule.policy import PlacementPolicy, ProbeNodes, Reservation
from functions.schedule.service import held_models, node_info, node_status, placing
from galaxy.v1 import common_pb2

CAP = Res(4000, 8192, 0)
MB = 1_000_000
TERM = ModelLocality(link_bps=125 * MB, disk_bps=2000 * MB, memory_bps=8000 * MB)


def node(nid: str, used: int = 0, **models: tuple[str, int]) -> NodeInfo:
    return NodeInfo(nid, f"{nid}:1", CAP, Res(used, used, 0), models=models or None)


def test_load_time_is_bytes_over_the_fastest_tier_holding_them() -> None:
    size = 250 * MB
    assert TERM.load_s(node("a"), "m", size) == size / (125 * MB)
    assert TERM.load_s(node("a", m=("disk", size)), "m", size) == size / (2000 * MB)
    assert TERM.load_s(node("a", m=("memory", size)), "m", size) == size / (8000 * MB)


def test_the_fetch_queue_delays_a_fetch() -> None:
    size = 250 * MB
    busy = node("b", other=("fetching", 500 * MB))
    assert busy.fetching_bytes() == 500 * MB
    assert TERM.load_s(busy, "m", size) == (750 * MB) / (125 * MB)
    # A model already on its way waits for the queue, not a second copy.
    coming = node("c", m=("fetching", size))
    assert TERM.load_s(coming, "m", size) < TERM.load_s(node("d"), "m", size) + 0.2


def test_without_a_model_it_is_least_loaded_exactly() -> None:
    n, free, need = node("a", 1000), Res(3000, 7192, 0), Res(100, 100, 0)
    base = least_loaded(n, free, need, "f")
    assert TERM(n, free, need, "f") == base
    assert TERM(n, free, need, Placing("f")) == base
    assert lookup("model_locality")(n, free, need, "f") == base


def test_the_cached_node_wins_unless_it_has_no_room() -> None:
    need, want = Res(500, 512, 0), Placing("llm", "m", 250 * MB)
    cached = node("cached", 3000, m=("disk", 250 * MB))  # 3/4 used
    empty = node("empty", 0)
    s_cached = TERM(cached, CAP - cached.allocated, need, want)
    s_empty = TERM(empty, CAP, need, want)
    assert s_cached > s_empty
    # Locality blind (least_loaded): the emptier node wins.
    assert least_loaded(cached, CAP - cached.allocated, need, want) < least_loaded(
        empty, CAP, need, want
    )
    # A tiny model leaves the choice to load.
    tiny = Placing("small", "t", 1 * MB)
    small = node("cached", 3000, t=("disk", MB))
    assert TERM(small, CAP - small.allocated, need, tiny) < TERM(empty, CAP, need, tiny)


def test_a_long_fetch_queue_loses_to_an_idle_link() -> None:
    need, want = Res(100, 100, 0), Placing("llm", "m", 250 * MB)
    queued = node("q", 0, other=("fetching", 2000 * MB))
    idle = node("i", 0)
    assert TERM(idle, CAP, need, want) > TERM(queued, CAP, need, want)


def test_unknown_size_is_read_from_the_node_that_holds_it() -> None:
    need, want = Res(100, 100, 0), Placing("llm", "m", 0)
    holder = node("h", 2000, m=("memory", 250 * MB))
    assert TERM(holder, CAP - holder.allocated, need, want) == least_loaded(
        holder, CAP - holder.allocated, need, want
    ) - (250 * MB) / (8000 * MB)


def test_wire_models_reach_node_info_bounded() -> None:
    s = common_pb2.NodeStatus(node_id="n", address="a:1", seq=3)
    for i in range(MODELS_PER_NODE + 10):
        s.models.add(digest=f"d{i}", tier="disk", size_bytes=i)
    s.models.add(digest="d0", tier="memory", size_bytes=1)  # a duplicate: first wins
    info = node_info(s)
    assert info.models is not None and len(info.models) == MODELS_PER_NODE
    assert info.models["d0"] == ("disk", 0)
    assert held_models([]) is None
    back = node_status(info)
    assert [m.digest for m in back.models][:2] == ["d0", "d1"]


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "probing"])
def test_schedule_places_a_model_function_on_the_node_holding_it(exact: bool) -> None:
    """8 nodes, power-of-2 sampling, the model on n5 only: with locality
    every placement lands on n5 (its holders join the sampled candidates);
    blind, about 2 in 8 do."""
    assert ScheduleConfig().scoring == "model_locality"
    fn = common_pb2.FunctionSpec(name="llm")
    fn.model.uri = "http://store/m.bin"
    fn.model.sha256 = "a" * 64
    fn.model.size_bytes = 250 * MB
    held = {"a" * 64: ("disk", 250 * MB)}
    hits = {"on": 0, "off": 0}
    for mode, term in (("on", TERM), ("off", least_loaded)):
        policy = PlacementPolicy(
            "s", clock=ManualClock(), rng=random.Random(3), score=term, d=2, exact=exact
        )
        used = {f"n{i}": Res() for i in range(8)}

        def status(nid: str, seq: int, used: dict[str, Res] = used) -> NodeInfo:
            models = held if nid == "n5" else None
            return NodeInfo(nid, f"{nid}:1", CAP, used[nid], seq=seq, models=models)

        for nid in used:
            policy.upsert(status(nid, 1))
        want = placing(fn, policy)
        assert isinstance(want, Placing) and want.model == "a" * 64
        for k in range(6):  # n5 has room for 8
            pl = policy.begin(Res(500, 512, 0), want)
            step = policy.advance(pl)
            while isinstance(step, ProbeNodes):
                for t in step.targets:
                    policy.record_probe(pl, t.node_id, status(t.node_id, 10 + k))
                step = policy.advance(pl)
            assert isinstance(step, Reservation)
            policy.confirm(step)
            used[step.node_id] = used[step.node_id] + step.need
            hits[mode] += step.node_id == "n5"
    assert hits["on"] == 6
    assert hits["off"] < 4


def test_an_unknown_size_comes_from_the_node_table() -> None:
    policy = PlacementPolicy("s", clock=ManualClock(), exact=True)
    policy.upsert(NodeInfo("n0", "n0:1", CAP, seq=1, models={"k": ("disk", 42)}))
    fn = common_pb2.FunctionSpec(name="llm")
    fn.model.uri = "/shared/m.bin"
    got = placing(fn, policy)
    assert isinstance(got, Placing) and got.model_bytes == 0  # key is the uri's hash
    fn.model.sha256 = "k"
    got = placing(fn, policy)
    assert isinstance(got, Placing) and got.model_bytes == 42
    assert placing(common_pb2.FunctionSpec(name="plain"), policy) == "plain"
