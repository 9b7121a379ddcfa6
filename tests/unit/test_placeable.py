"""A spec no registered node could ever place is refused at deploy, naming
the field and the largest node's figure; with no node known nothing is."""

from __future__ import annotations

import pytest

from controlplane.controller.placeable import check_placeable, total
from controlplane.runtime.errors import FailedPrecondition
from galaxy.v1 import common_pb2


def res(cpu: int, mem: int, gpus: int = 0) -> common_pb2.Resources:
    return common_pb2.Resources(cpu_millis=cpu, memory_mib=mem, gpus=gpus)


def spec(cpu: int, mem: int, gpus: int = 0) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(name="f", resources=res(cpu, mem, gpus))


NODES = [res(4000, 8192), res(8000, 4096)]


def refusal(s: common_pb2.FunctionSpec, nodes: list[common_pb2.Resources]) -> str:
    with pytest.raises(FailedPrecondition) as e:
        check_placeable(s, nodes)
    return e.value.message


def test_gpus_on_a_cluster_without_any() -> None:
    msg = refusal(spec(100, 128, gpus=2), NODES)
    assert msg.startswith("resources.gpus: 2 per instance")
    assert "largest of the 2 registered nodes has 0" in msg


def test_more_memory_or_cpu_than_the_largest_node() -> None:
    assert refusal(spec(100, 9000), NODES).startswith("resources.memory_mib: 9000")
    assert "has 8192" in refusal(spec(100, 9000), NODES)
    assert "has 8000" in refusal(spec(8001, 128), NODES)


def test_each_figure_fits_some_node_but_none_has_all() -> None:
    # 6000 millis fits only the 4096 MiB node, 6000 MiB only the 4000 m one.
    msg = refusal(spec(6000, 6000), NODES)
    assert msg.startswith("resources: no one of the 2 registered nodes")


def test_what_fits_a_node_and_anything_before_nodes_register() -> None:
    check_placeable(spec(8000, 4096), NODES)  # exactly the second node
    check_placeable(spec(4000, 8192), NODES)
    check_placeable(spec(100_000, 1 << 20, gpus=8), [])  # no node known yet
    assert total([]) is None
    assert total(NODES) == res(12000, 12288)
