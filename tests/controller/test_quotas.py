"""Deploys are bounded: a spec cannot ask for more instances than the
cluster's per-function limit, and the instances all functions keep running
idle (min_scale) are bounded together (RESOURCE_EXHAUSTED naming the field
and the flag). Nothing is stored when a deploy is refused."""

from __future__ import annotations

import pytest

from controlplane.controller.functions_store import FunctionStore
from controlplane.runtime.errors import ResourceExhausted
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
