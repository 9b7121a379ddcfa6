"""NodeRegistry: seq ordering, liveness by the clock, owners by membership."""

from __future__ import annotations

from controlplane.runtime import rendezvous
from controlplane.runtime.clock import ManualClock
from functions.clustermgr.policy import NodeRegistry, Registered, Updated
from galaxy.v1 import common_pb2

SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR


def status(nid: str, seq: int, cpu_used: int = 0) -> common_pb2.NodeStatus:
    return common_pb2.NodeStatus(
        node_id=nid,
        address=f"agent:{nid}",
        capacity=common_pb2.Resources(cpu_millis=4000, memory_mib=8192),
        allocated=common_pb2.Resources(cpu_millis=cpu_used),
        seq=seq,
    )


def membership(
    epoch: int, schedule: list[str], cmf: tuple[str, ...] | list[str] = ()
) -> common_pb2.Membership:
    inst = [common_pb2.ControlInstance(id=i, kind=SCHEDULE, address=f"{i}:1") for i in schedule]
    inst += [common_pb2.ControlInstance(id=i, kind=CLUSTERMGR, address=f"{i}:1") for i in cmf]
    return common_pb2.Membership(epoch=epoch, instances=inst)


def test_register_update_and_seq_ordering() -> None:
    reg = NodeRegistry(clock=ManualClock())
    assert reg.update(status("a", 1)) is Updated.UNKNOWN
    assert reg.register(status("a", 1)) is Registered.NEW
    assert reg.register(status("a", 1)) is Registered.REFRESHED
    assert reg.update(status("a", 2)) is Updated.SAME
    assert reg.update(status("a", 3, cpu_used=500)) is Updated.CHANGED
    assert reg.update(status("a", 2, cpu_used=100)) is Updated.STALE
    rec = reg.get("a")
    assert rec is not None and rec.status.seq == 3 and rec.status.allocated.cpu_millis == 500
    # An agent that restarted counts its seq from the start again.
    assert reg.register(status("a", 1)) is Registered.RESTARTED
    assert reg.update(status("a", 2)) is Updated.SAME  # accepted, not stale


def test_new_incarnation_is_a_restart_even_with_a_higher_seq() -> None:
    # Agents count seq from wall-clock time, so a quick restart sends a
    # higher seq than its previous life: only the incarnation tells.
    reg = NodeRegistry(clock=ManualClock())
    first = status("a", 100)
    first.incarnation = 100
    assert reg.register(first) is Registered.NEW
    again = status("a", 150)
    again.incarnation = 100  # the same life registering again
    assert reg.register(again) is Registered.REFRESHED
    restarted = status("a", 200)
    restarted.incarnation = 200
    assert reg.register(restarted) is Registered.RESTARTED
    legacy = status("a", 300)  # incarnation 0: not reported, not a restart
    assert reg.register(legacy) is Registered.REFRESHED


def test_registry_keeps_its_own_copy() -> None:
    reg = NodeRegistry(clock=ManualClock())
    s = status("a", 1)
    reg.register(s)
    s.seq = 99
    rec = reg.get("a")
    assert rec is not None and rec.status.seq == 1


def test_liveness_follows_the_clock() -> None:
    clock = ManualClock()
    reg = NodeRegistry(dead_after_s=3.0, clock=clock)
    reg.register(status("a", 1))
    reg.register(status("b", 1))
    clock.advance(2.0)
    reg.update(status("a", 2))
    clock.advance(1.5)  # b silent for 3.5 s, a for 1.5 s
    assert [r.status.node_id for r in reg.dead_nodes()] == ["b"]
    assert reg.dead_nodes(now=clock.now() + 2.0) != []  # a would be dead by then
    assert [r.status.node_id for r in reg.mark_dead()] == ["b"]
    assert reg.mark_dead() == []  # declared once
    rec = reg.get("b")
    assert rec is not None and not rec.alive
    assert reg.update(status("b", 2)) is Updated.REVIVED
    assert rec.alive and reg.dead_nodes() == []
    assert reg.forget("b") is rec and reg.update(status("b", 3)) is Updated.UNKNOWN


def test_owners_and_owner_changes_on_membership_change() -> None:
    reg = NodeRegistry(clock=ManualClock())
    nodes = [f"node-{i}" for i in range(200)]
    for n in nodes:
        reg.register(status(n, 1))
    assert all(r.owner == "" for r in reg.records())

    first = reg.set_membership(membership(1, ["s-1", "s-2"]))
    assert first is not None and len(first) == 200  # everyone gets an owner
    for r in reg.records():
        assert r.owner == rendezvous.owner(r.status.node_id, ["s-1", "s-2"])
    owner = reg.owner("node-0")
    assert owner is not None and owner.id == reg.get("node-0").owner  # type: ignore[union-attr]

    # Adding s-3 moves exactly the nodes s-3 now wins, all of them to s-3.
    moved = reg.set_membership(membership(2, ["s-1", "s-2", "s-3"]))
    assert moved is not None
    expect = {n for n in nodes if rendezvous.owner(n, ["s-1", "s-2", "s-3"]) == "s-3"}
    assert {c.node_id for c in moved} == expect
    assert all(c.new == "s-3" and c.old in ("s-1", "s-2") for c in moved)
    assert 40 < len(moved) < 95  # about a third

    # Removing s-1 moves only s-1's nodes.
    had_s1 = {r.status.node_id for r in reg.records() if r.owner == "s-1"}
    moved = reg.set_membership(membership(3, ["s-2", "s-3"]))
    assert moved is not None and {c.node_id for c in moved} == had_s1
    assert all(c.old == "s-1" for c in moved)

    # An old or repeated epoch changes nothing.
    assert reg.set_membership(membership(2, ["s-9"])) is None
    assert reg.set_membership(membership(3, ["s-9"])) is None

    # A node registered later gets its owner at once.
    reg.register(status("late", 1))
    assert reg.get("late").owner == rendezvous.owner("late", ["s-2", "s-3"])  # type: ignore[union-attr]


def test_nodes_of_other_clustermgr_instances() -> None:
    reg = NodeRegistry(clock=ManualClock())
    for i in range(50):
        reg.register(status(f"n{i}", 1))
    reg.set_membership(membership(1, ["s-1"], ["c-1"]))
    assert reg.not_mine("c-1") == []
    reg.set_membership(membership(2, ["s-1"], ["c-1", "c-2"]))
    theirs = reg.not_mine("c-1")
    assert set(theirs) == {
        f"n{i}" for i in range(50) if rendezvous.owner(f"n{i}", ["c-1", "c-2"]) == "c-2"
    }
    assert reg.not_mine("not-a-member") == []


def test_a_node_is_due_exactly_dead_after_its_last_beat() -> None:
    clock = ManualClock()
    reg = NodeRegistry(dead_after_s=3.0, clock=clock)
    assert reg.next_deadline() is None  # nothing alive: nothing to wake for
    reg.register(status("a", 1))  # beats at t=0
    assert reg.next_deadline() == 3.0
    assert reg.dead_nodes(now=3.0 - 1e-9) == []
    assert [r.status.node_id for r in reg.dead_nodes(now=3.0)] == ["a"]
    assert reg.mark_dead(now=3.0 - 1e-9) == []
    clock.set(3.0)
    assert [r.status.node_id for r in reg.mark_dead()] == ["a"]
    assert reg.next_deadline() is None  # dead nodes have no deadline


def test_next_deadline_follows_the_oldest_beat() -> None:
    clock = ManualClock()
    reg = NodeRegistry(dead_after_s=3.0, clock=clock)
    reg.register(status("a", 1))
    clock.advance(0.5)
    reg.register(status("b", 1))
    clock.advance(0.5)
    reg.register(status("c", 1))
    assert reg.next_deadline() == 3.0  # a's
    clock.advance(1.0)  # t = 2
    reg.update(status("a", 2))  # a beats: b is now the oldest
    assert reg.next_deadline() == 3.5
    assert reg.update(status("b", 0)) is Updated.STALE  # reordered: no move
    assert reg.next_deadline() == 3.5
    assert reg.forget("b") is not None
    assert reg.next_deadline() == 4.0  # c's
    clock.set(4.0)
    assert [r.status.node_id for r in reg.mark_dead()] == ["c"]
    assert reg.next_deadline() == 5.0  # a's (beat at 2)
    clock.set(4.5)
    assert reg.update(status("c", 2)) is Updated.REVIVED  # back: a deadline again
    assert reg.next_deadline() == 5.0
    clock.set(5.0)
    assert [r.status.node_id for r in reg.mark_dead()] == ["a"]
    assert reg.next_deadline() == 7.5
