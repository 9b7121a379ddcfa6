"""ClusterMgr answers a heartbeat batch (HeartbeatBatches) as Update answers
each of its statuses: the same replies (reregister, wrong_owner, the
interval) and the same registry afterwards, for random sequences of
statuses (unknown nodes, nodes another instance owns, stale and changed
statuses, dead nodes that come back). Two servicers with manual clocks,
one fed status by status, the other batch by batch."""

from __future__ import annotations

import random

import pytest

from controlplane.runtime.clock import ManualClock
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import ClusterMgrServicer
from galaxy.v1 import clustermgr_pb2, common_pb2

CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR
NODES = [f"node-{i}" for i in range(40)]


def servicer() -> tuple[ClusterMgrServicer, ManualClock]:
    clock = ManualClock()
    cm = ClusterMgrServicer(NodeRegistry(clock=clock, dead_after_s=3.0), clustermgr_id="c-1")
    return cm, clock


def split(cm: ClusterMgrServicer) -> None:
    """c-2 joins: about half the nodes are no longer c-1's."""
    m = common_pb2.Membership(epoch=1)
    m.instances.add(id="c-1", kind=CLUSTERMGR, address="127.0.0.1:1")
    m.instances.add(id="c-2", kind=CLUSTERMGR, address="127.0.0.1:2")
    cm.apply_membership(m)


def state(cm: ClusterMgrServicer) -> dict[str, tuple[bytes, bool]]:
    return {
        r.status.node_id: (r.status.SerializeToString(), r.alive) for r in cm.registry.records()
    }


@pytest.mark.parametrize("seed", range(6))
async def test_a_batch_is_answered_as_update_answers_each_status(seed: int) -> None:
    rng = random.Random(seed)
    (one, clock_a), (batched, clock_b) = servicer(), servicer()
    seq = dict.fromkeys(NODES, 0)

    def status(nid: str) -> common_pb2.NodeStatus:
        # Mostly newer, sometimes stale; capacity changes now and then.
        seq[nid] = max(1, seq[nid] + rng.choice([1, 1, 1, 0, -1]))
        cpu = rng.choice([1000, 1000, 1000, 500])
        return common_pb2.NodeStatus(
            node_id=nid,
            address="127.0.0.1:9",
            capacity=common_pb2.Resources(cpu_millis=cpu, memory_mib=1024),
            seq=seq[nid],
        )

    for nid in rng.sample(NODES, 25):  # the rest are unknown here
        s = status(nid)
        await one.RegisterNode(s, None)  # type: ignore[arg-type]
        await batched.RegisterNode(s, None)  # type: ignore[arg-type]
    for cm in (one, batched):
        split(cm)
    # Records of nodes another instance owns (left from a race with a
    # membership change): a wrong_owner answer must forget them.
    for nid in [n for n in NODES if one.registry.membership.owner(CLUSTERMGR, n).id == "c-2"][:5]:
        s = status(nid)
        one.registry.register(s)
        batched.registry.register(s)
    answers = {"reregister": 0, "wrong_owner": 0, "ok": 0}
    for _ in range(30):
        batch = clustermgr_pb2.NodeStatusBatch(
            statuses=[status(n) for n in rng.sample(NODES, rng.randint(1, 12))]
        )
        want = [one.update(s) for s in batch.statuses]
        got = batched.update_batch(batch)
        assert [r.node_id for r in got.replies] == [s.node_id for s in batch.statuses]
        assert [r.reply for r in got.replies] == want
        assert not got.reopen and not any(r.reopen for r in got.replies)
        assert state(batched) == state(one)
        for r in want:
            key = "reregister" if r.reregister else "wrong_owner" if r.wrong_owner else "ok"
            answers[key] += 1
        step = rng.choice([0.5, 1.0, 2.5])  # now and then past dead_after_s
        clock_a.advance(step)
        clock_b.advance(step)
        assert sorted(one.check_liveness()) == sorted(batched.check_liveness())
    assert batched.node_updates == one.node_updates
    assert all(answers.values()), answers  # every kind of answer was compared


def test_the_reply_says_reopen_on_the_batch() -> None:
    cm = ClusterMgrServicer(NodeRegistry(clock=ManualClock()))
    batch = clustermgr_pb2.NodeStatusBatch(statuses=[common_pb2.NodeStatus(node_id="n", seq=1)])
    reply = cm.update_batch(batch, reopen=True)
    assert reply.reopen and not reply.replies[0].reopen
    assert reply.replies[0].reply.reregister
