"""Deploys are bounded: a spec cannot ask for more instances than the
cluster's per-function limit, and the instances all functions keep running
idle (min_scale) are bounded together (RESOURCE_EXHAUSTED naming the field
and the flag). Nothing is stored when a deploy is refused."""

from __future__ import annotations

import pytest

from controlplane.controller.functions_store import FunctionStore
from controlplane.runtime import quotas as quotas_mod
from controlplane.runtime.errors import ResourceExhausted
from controlplane.runtime.quotas import NamespaceQuotas, Quota
from galaxy.v1 import common_pb2
from statestore.memory import MemoryStore


def fn(name: str, min_scale: int = 0, max_scale: int = 0) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(
        name=name, command=["x"], min_scale=min_scale, max_scale=max_scale
    )


async def test_per_function_and_reserved_instance_limits() -> None:
    store = FunctionStore(MemoryStore(), max_instances_per_function=50, max_reserved_instances=60)
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("huge", min_scale=5000))
    assert e.value.message.startswith("min_scale: 5000") and "--max-instances-per-function" in (
        e.value.message
    )
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("wide", max_scale=51))
    assert e.value.message.startswith("max_scale: 51")
    await store.deploy(fn("a", min_scale=40, max_scale=50))
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("b", min_scale=30, max_scale=50))
    assert e.value.message.startswith("min_scale:") and "70" in e.value.message
    assert "--max-reserved-instances" in e.value.message
    assert [f.name for f in await store.list()] == ["a"]  # nothing stored when refused
    # Redeploying a function counts its own min_scale once, not twice.
    again = await store.deploy(fn("a", min_scale=50, max_scale=50))
    assert (again.min_scale, again.revision) == (50, 2)
    await store.deploy(fn("b", min_scale=10))  # 60 in all: at the limit
    with pytest.raises(ResourceExhausted):
        await store.deploy(fn("c", min_scale=1))


def ns_fn(name: str, ns: str, max_scale: int, cpu: int = 100) -> common_pb2.FunctionSpec:
    spec = fn(name, max_scale=max_scale)
    spec.namespace = ns
    spec.resources.cpu_millis = cpu
    spec.resources.memory_mib = 64
    return spec


async def test_namespace_quotas_count_what_functions_may_claim() -> None:
    quotas = NamespaceQuotas(
        {
            "team-a": Quota(functions=2, cpu_millis=1000),
            quotas_mod.EVERY: Quota(instances=5),
        }
    )
    store = FunctionStore(MemoryStore(), quotas=quotas)
    await store.deploy(ns_fn("a1", "team-a", max_scale=4, cpu=200))  # 800 millis
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(ns_fn("a2", "team-a", max_scale=2, cpu=200))  # 1200 millis
    assert e.value.message.startswith("quota cpu_millis of namespace team-a: 1000")
    assert "1200" in e.value.message
    # Redeploying counts the function once: 4 -> 5 instances of 200 m is over,
    # 4 -> 3 is fine.
    with pytest.raises(ResourceExhausted):
        await store.deploy(ns_fn("a1", "team-a", max_scale=6, cpu=200))
    await store.deploy(ns_fn("a1", "team-a", max_scale=3, cpu=200))
    await store.deploy(ns_fn("a2", "team-a", max_scale=1, cpu=200))
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(ns_fn("a3", "team-a", max_scale=1, cpu=1))
    assert e.value.message.startswith("quota functions of namespace team-a: 2")
    # Other namespaces get the '*' quota, each on its own.
    await store.deploy(ns_fn("b1", "team-b", max_scale=5))
    await store.deploy(ns_fn("c1", "team-c", max_scale=5))
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(ns_fn("b2", "team-b", max_scale=1))
    assert e.value.message.startswith("quota instances of namespace team-b: 5")
    names = sorted(f.name for f in await store.list())
    assert names == ["a1", "a2", "b1", "c1"]  # nothing stored when refused


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("team-a", "expected NS=KEY:N"),
        ("team-a=cpu:1", "is not one of"),
        ("team-a=gpus:-1", "needs a whole number"),
        ("team-a=gpus", "needs a whole number"),
    ],
)
def test_quota_flags_name_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        quotas_mod.parse(text)
    assert quotas_mod.parse("t=gpus:0,functions:3") == ("t", Quota(functions=3, gpus=0))
