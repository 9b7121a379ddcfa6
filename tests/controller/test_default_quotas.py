"""Default quotas: a namespace no --namespace-quota names may keep at most
a share of the cluster running idle (min_scale x resources against the
registered nodes' capacity, min_scale against --max-reserved-instances);
an admin's quota replaces the default; an unplaceable spec is refused at
deploy. Nothing is stored when a deploy is refused."""

from __future__ import annotations

import pytest

from controlplane.controller.config import ControllerConfig
from controlplane.controller.functions_store import FunctionStore
from controlplane.runtime.errors import FailedPrecondition, ResourceExhausted
from controlplane.runtime.quotas import DEFAULT_FRACTION, NamespaceQuotas, Quota, default_quota
from galaxy.v1 import common_pb2
from statestore.memory import MemoryStore

#: Four nodes of `galaxy up`'s default size: 16,000 millicores, 32 GiB.
NODES = [common_pb2.Resources(cpu_millis=4000, memory_mib=8192)] * 4


def fn(name: str, ns: str, min_scale: int, max_scale: int = 0, cpu: int = 250):
    spec = common_pb2.FunctionSpec(
        name=name, command=["x"], namespace=ns, min_scale=min_scale, max_scale=max_scale
    )
    spec.resources.cpu_millis = cpu
    spec.resources.memory_mib = 64
    return spec


def test_default_quota_is_a_share_of_what_the_cluster_has() -> None:
    cap = common_pb2.Resources(cpu_millis=16000, memory_mib=32768, gpus=2)
    assert default_quota(0.5, cap, 5000) == Quota(
        instances=2500, cpu_millis=8000, memory_mib=16384, gpus=1
    )
    # Capacity unknown (no node registered yet): only the instance count.
    assert default_quota(0.5, None, 5000) == Quota(instances=2500)
    assert default_quota(0.0, cap, 5000) is None
    assert ControllerConfig().default_quota_fraction == DEFAULT_FRACTION > 0


async def test_one_namespace_cannot_reserve_the_cluster() -> None:
    store = FunctionStore(MemoryStore(), quotas=NamespaceQuotas({}, DEFAULT_FRACTION))
    # The case: min_scale 64 x 250 m = 16,000 m, all the CPU.
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("hog", "team-a", min_scale=64), NODES)
    msg = e.value.message
    assert msg.startswith("default quota cpu_millis of namespace team-a (0.5 of the")
    assert ": 8000; this deploy would make it 16000" in msg and "--namespace-quota" in msg
    await store.deploy(fn("a1", "team-a", min_scale=30), NODES)  # 7,500 m
    with pytest.raises(ResourceExhausted):
        await store.deploy(fn("a2", "team-a", min_scale=3), NODES)  # 8,250 m
    # Another namespace keeps its own share; max_scale alone costs nothing.
    await store.deploy(fn("b1", "team-b", min_scale=30), NODES)
    await store.deploy(fn("b2", "team-b", min_scale=0, max_scale=1000), NODES)
    assert [f.name for f in await store.list()] == ["a1", "b1", "b2"]


async def test_before_nodes_register_only_reserved_instances_are_bounded() -> None:
    store = FunctionStore(
        MemoryStore(), max_reserved_instances=100, quotas=NamespaceQuotas({}, 0.5)
    )
    await store.deploy(fn("a1", "team-a", min_scale=50))
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("a2", "team-a", min_scale=1))
    assert e.value.message.startswith(
        "default quota instances of namespace team-a (0.5 of --max-reserved-instances): 50"
    )


async def test_an_admin_quota_replaces_the_default_and_counts_min_scale() -> None:
    quotas = NamespaceQuotas({"team-a": Quota(cpu_millis=20000)}, DEFAULT_FRACTION)
    store = FunctionStore(MemoryStore(), quotas=quotas)
    await store.deploy(fn("big", "team-a", min_scale=64, max_scale=64), NODES)  # raised
    # A min_scale above the quota is refused (max_scale defaults up to it).
    with pytest.raises(ResourceExhausted) as e:
        await store.deploy(fn("huge", "team-a", min_scale=200), NODES)
    assert e.value.message.startswith("quota cpu_millis of namespace team-a: 20000")


async def test_unplaceable_spec_is_refused_and_not_stored() -> None:
    store = FunctionStore(MemoryStore(), quotas=NamespaceQuotas({}, DEFAULT_FRACTION))
    gpu = fn("gpu", "team-a", min_scale=0)
    gpu.resources.gpus = 2
    with pytest.raises(FailedPrecondition) as e:
        await store.deploy(gpu, NODES)
    assert e.value.message.startswith("resources.gpus: 2 per instance")
    assert await store.list() == []
    await store.deploy(gpu)  # no node registered yet: accepted
