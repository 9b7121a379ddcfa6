"""Res and NodeCapacity fast paths: the descriptor-based constructor, the
``clamped`` shortcut, ``to_proto`` and ``NodeCapacity.fits`` give what the
straightforward code gives, and Res stays an immutable dataclass."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import pytest

from controlplane.nodeagent.capacity import NodeCapacity, Res
from galaxy.v1 import common_pb2


def test_res_is_still_a_frozen_slotted_dataclass():
    r = Res(1, 2, 3)
    assert (r.cpu_millis, r.memory_mib, r.gpus) == (1, 2, 3)
    assert Res() == Res(0, 0, 0) and Res(memory_mib=5) == Res(0, 5, 0)
    assert r == Res(1, 2, 3) and hash(r) == hash(Res(1, 2, 3)) and r != Res(1, 2, 4)
    assert repr(r) == "Res(cpu_millis=1, memory_mib=2, gpus=3)"
    assert dataclasses.asdict(r) == {"cpu_millis": 1, "memory_mib": 2, "gpus": 3}
    assert dataclasses.replace(r, gpus=7) == Res(1, 2, 7)
    assert [f.name for f in dataclasses.fields(Res)] == ["cpu_millis", "memory_mib", "gpus"]
    assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
    assert not hasattr(r, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cpu_millis = 9  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_arithmetic_and_clamping_as_component_wise_ints(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        a = Res(rng.randint(-5, 5) * 100, rng.randint(-5, 5) * 64, rng.randint(-2, 2))
        b = Res(rng.randint(-5, 5) * 100, rng.randint(-5, 5) * 64, rng.randint(-2, 2))
        assert a + b == Res(
            *(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))
        )
        assert a - b == Res(
            *(x - y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))
        )
        c = a.clamped()
        assert c == Res(*(max(x, 0) for x in dataclasses.astuple(a)))
        if min(dataclasses.astuple(a)) >= 0:
            assert c is a  # immutable: no copy needed


@pytest.mark.parametrize(
    "r",
    [Res(), Res(4000, 8192, 1), Res(-5, 3, 0), Res(2**32, 2**40, -1), Res(2**32 - 1, 0, 2)],
)
def test_to_proto_clamps_to_uint32(r):
    def u32(v: int) -> int:
        return min(max(v, 0), 2**32 - 1)

    want = common_pb2.Resources(
        cpu_millis=u32(r.cpu_millis), memory_mib=u32(r.memory_mib), gpus=u32(r.gpus)
    )
    assert r.to_proto() == want
    assert r.to_proto().SerializeToString(deterministic=True) == want.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize("seed", range(5))
def test_fits_is_fits_in_the_free_resources(seed):
    rng = random.Random(seed)
    cap = NodeCapacity(Res(4000, 8192, 1), "n")
    for i in range(500):
        need = Res(rng.choice([0, 250, 1000, 3000]), rng.choice([0, 128, 4096]), rng.choice([0, 1]))
        assert cap.fits(need) == need.fits_in(cap.free_resources())
        if cap.fits(need) and rng.random() < 0.6:
            cap.allocate(f"i{i}", need)
        elif len(cap) and rng.random() < 0.5:
            cap.free(rng.choice(list(cap)))
