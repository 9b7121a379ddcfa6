"""The controller's function store keeps immutable revisions: a changed
spec makes the next one, an unchanged one none; traffic names revisions
that exist; old revisions are pruned unless traffic names them."""

from __future__ import annotations

import pytest

from controlplane.controller.functions_store import MAX_REVISIONS, REVISIONS, FunctionStore
from controlplane.runtime.errors import InvalidArgument, NotFound
from galaxy.v1 import common_pb2
from statestore.memory import MemoryStore


def fn(version_env: str = "") -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec(name="f", command=["python3", "x.py"])
    if version_env:
        s.env["V"] = version_env
    return s


async def test_revisions_follow_changes_only() -> None:
    store = FunctionStore(MemoryStore())
    assert (await store.deploy(fn())).revision == 1
    assert (await store.deploy(fn())).revision == 1  # unchanged: no new revision
    second = await store.deploy(fn("2"))
    assert second.revision == 2
    revs = await store.list_revisions("f")
    assert [(r.name, r.revision) for r in revs] == [("f-00001", 1), ("f-00002", 2)]
    assert "V" not in revs[0].env and revs[1].env["V"] == "2"
    one = await store.get("f-00001")  # what Dispatch fetches to route revision 1
    assert one.name == "f-00001" and one.revision == 1 and "V" not in one.env


async def test_traffic_survives_deploys_and_names_existing_revisions() -> None:
    store = FunctionStore(MemoryStore())
    await store.deploy(fn())
    await store.deploy(fn("2"))
    T = common_pb2.TrafficTarget
    split = [T(revision=1, percent=90), T(revision=2, percent=10, tag="canary")]
    stored = await store.set_traffic("f", split)
    assert [(t.revision, t.percent, t.tag) for t in stored.traffic] == [
        (1, 90, ""),
        (2, 10, "canary"),
    ]
    third = await store.deploy(fn("3"))
    assert third.revision == 3 and list(third.traffic) == split  # a deploy keeps the split
    with pytest.raises(InvalidArgument) as e:
        await store.set_traffic("f", [T(revision=4, percent=100)])
    assert e.value.message.startswith("traffic[0].revision")
    with pytest.raises(NotFound):
        await store.set_traffic("g", [T(percent=100)])
    # Deploy input cannot set revision or traffic.
    sneaky = fn("4")
    sneaky.revision = 99
    sneaky.traffic.append(T(revision=1, percent=100))
    fourth = await store.deploy(sneaky)
    assert fourth.revision == 4 and list(fourth.traffic) == split


async def test_old_revisions_are_pruned_unless_traffic_names_them() -> None:
    mem = MemoryStore()
    store = FunctionStore(mem)
    await store.deploy(fn("1"))
    await store.set_traffic("f", [common_pb2.TrafficTarget(revision=1, percent=100)])
    for i in range(2, MAX_REVISIONS + 5):
        await store.deploy(fn(str(i)))
    kept = [kv.key for kv in await mem.get_prefix(REVISIONS + "f/")]
    numbers = sorted(int(k.rsplit("/", 1)[1]) for k in kept)
    latest = MAX_REVISIONS + 4
    assert numbers[0] == 1  # named by traffic: kept
    assert numbers[1:] == list(range(latest - MAX_REVISIONS + 1, latest + 1))
    await store.delete("f")
    assert not await mem.get_prefix(REVISIONS + "f/")
    with pytest.raises(NotFound):
        await store.get("f-00001")
