"""``NodeRegistry.update`` compares the scalar fields before the serialized
resources: the outcome is still "content changed" as ``_content`` defines
it (everything but seq)."""

from __future__ import annotations

import random

import pytest

from controlplane.runtime.clock import ManualClock
from functions.clustermgr.policy import NodeRegistry, Updated, _content
from galaxy.v1 import common_pb2


def rand_status(rng: random.Random, seq: int) -> common_pb2.NodeStatus:
    return common_pb2.NodeStatus(
        node_id="n",
        address=rng.choice(["a:1", "a:1", "a:1", "b:2", ""]),
        capacity=common_pb2.Resources(cpu_millis=rng.choice([4000, 4000, 8000]), memory_mib=8192),
        allocated=common_pb2.Resources(
            cpu_millis=rng.choice([0, 0, 250, 500]), memory_mib=rng.choice([0, 128]), gpus=0
        ),
        instances=rng.choice([0, 1, 1, 2]),
        seq=seq,
    )


@pytest.mark.parametrize("seed", range(10))
def test_changed_is_content_inequality(seed):
    rng = random.Random(seed)
    reg = NodeRegistry(clock=ManualClock())
    first = rand_status(rng, 1)
    reg.register(first)
    known = first
    for seq in range(2, 800):
        s = rand_status(rng, seq)
        out = reg.update(s)
        want = Updated.CHANGED if _content(s) != _content(known) else Updated.SAME
        assert out is want
        rec = reg.get("n")
        assert rec is not None and rec.status == s and rec.status is not s
        known = s
