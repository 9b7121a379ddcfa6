"""NodeCapacity and Res: pure policy, no I/O."""

from __future__ import annotations

import pytest

from controlplane.nodeagent.capacity import ZERO, NodeCapacity, Res
from controlplane.runtime.errors import ResourceExhausted
from galaxy.v1 import common_pb2


def test_res_arithmetic_and_fits():
    a, b = Res(500, 1024, 1), Res(200, 24, 0)
    assert a + b == Res(700, 1048, 1)
    assert a - b == Res(300, 1000, 1)
    assert b - a == Res(-300, -1000, -1)  # a deficit stays visible
    assert (b - a).clamped() == ZERO
    assert b.fits_in(a) and not a.fits_in(b)
    assert Res(500, 1024, 1).fits_in(a)  # equal fits
    assert not Res(0, 0, 2).fits_in(a)
    assert ZERO.is_zero() and not b.is_zero()


def test_res_proto_round_trip():
    p = common_pb2.Resources(cpu_millis=250, memory_mib=64, gpus=2)
    assert Res.from_proto(p) == Res(250, 64, 2)
    assert Res(250, 64, 2).to_proto() == p
    assert Res.from_proto(None) == ZERO
    assert Res.from_proto(common_pb2.Resources()) == ZERO
    # The wire type is unsigned: a deficit is sent as 0.
    assert Res(-5, 10, 0).to_proto() == common_pb2.Resources(memory_mib=10)


def test_allocate_and_free():
    n = NodeCapacity(Res(1000, 2048, 1), "n-1")
    assert n.fits(Res(1000, 2048, 1))
    assert n.allocate("a", Res(400, 1024, 0))
    assert n.allocate("b", Res(400, 512, 1))
    assert n.allocated == Res(800, 1536, 1)
    assert n.free_resources() == Res(200, 512, 0)
    assert len(n) == 2 and set(n) == {"a", "b"}
    assert n.holds("a") and n.held("a") == Res(400, 1024, 0)
    assert n.free("a") == Res(400, 1024, 0)
    assert n.free_resources() == Res(600, 1536, 0)
    assert not n.holds("a")


def test_idempotent_by_instance_id():
    n = NodeCapacity(Res(1000, 1000, 0), "n-1")
    assert n.allocate("a", Res(600, 100, 0)) is True
    # A retry of the same instance changes nothing, even though a second
    # 600m would not fit.
    assert n.allocate("a", Res(600, 100, 0)) is False
    assert n.allocated == Res(600, 100, 0)
    assert n.free("a") is not None
    assert n.free("a") is None
    assert n.free("never") is None
    assert n.allocated == ZERO


def test_exhausted_message_names_node_and_shortfall():
    n = NodeCapacity(Res(1000, 1000, 0), "n-3")
    n.allocate("a", Res(800, 100, 0))
    with pytest.raises(ResourceExhausted) as e:
        n.allocate("b", Res(500, 100, 0))
    assert e.value.message == "node n-3 has 200m cpu free, instance needs 500m"
    with pytest.raises(ResourceExhausted) as e:
        n.allocate("c", Res(500, 2000, 1))
    msg = e.value.message
    assert "200m cpu free, instance needs 500m" in msg
    assert "900Mi memory free, instance needs 2000Mi" in msg
    assert "0 gpus free, instance needs 1" in msg
    # A refused allocation leaves the ledger as it was.
    assert n.allocated == Res(800, 100, 0) and not n.holds("b")


def test_accepts_proto_capacity_and_rejects_negatives():
    n = NodeCapacity(common_pb2.Resources(cpu_millis=100, memory_mib=10), "x")
    assert n.capacity == Res(100, 10, 0)
    with pytest.raises(ValueError):
        NodeCapacity(Res(-1, 0, 0))
    with pytest.raises(ValueError):
        n.allocate("neg", Res(-50, 0, 0))


def test_zero_request_always_fits_even_when_full():
    n = NodeCapacity(Res(100, 100, 0), "n")
    n.allocate("full", Res(100, 100, 0))
    assert n.fits(ZERO)
    assert n.allocate("free-rider", ZERO)
    assert len(n) == 2
