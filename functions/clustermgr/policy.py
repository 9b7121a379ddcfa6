"""ClusterMgr's node registry. Pure: no I/O, time from an injected clock.

It keeps the latest status of each node (ordered by the sender's seq), when
each node was last heard from, which nodes are dead, and which Schedule
instance owns each node under the current membership (rendezvous hashing via
``MembershipView``). The servicer turns its answers into RPCs; the simulator
can drive it directly.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.membership import MembershipView
from galaxy.v1 import common_pb2

SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR


@dataclass
class NodeRecord:
    """What the registry knows about one node."""

    status: common_pb2.NodeStatus
    last_seen: float
    alive: bool = True
    #: Id of the owning Schedule instance ("" = none in the membership).
    owner: str = ""


class Registered(enum.Enum):
    """Outcome of ``register``."""

    #: First time seen (or seen again after it was forgotten).
    NEW = "new"
    #: Known and same incarnation (seq did not go back): a refresh.
    REFRESHED = "refreshed"
    #: Known, but a new incarnation (or the seq went back): the node agent
    #: restarted and every instance of its previous life has ended. Its
    #: Schedule owner must forget the old incarnation (which it would
    #: otherwise prefer, having the higher seq) before learning the new one,
    #: and Dispatch must stop routing to the old instances at once rather
    #: than when the node would be declared dead (which a quick restart
    #: never lets happen).
    RESTARTED = "restarted"


class Updated(enum.Enum):
    """Outcome of ``update`` (a heartbeat)."""

    #: Not registered: the node must call RegisterNode again.
    UNKNOWN = "unknown"
    #: Older than what is known (reordered delivery): ignored.
    STALE = "stale"
    #: Recorded; content (capacity, allocation, address, instances) unchanged.
    SAME = "same"
    #: Recorded; content changed.
    CHANGED = "changed"
    #: Recorded, and the node had been declared dead: it is alive again.
    REVIVED = "revived"


@dataclass(frozen=True)
class OwnerChange:
    """A node whose owning Schedule instance changed ("" = none)."""

    node_id: str
    old: str
    new: str


def _content(s: common_pb2.NodeStatus) -> tuple[object, ...]:
    # Everything but seq: what the state store and Schedule care about
    # (the models a node holds, by tier, reach placement's locality term).
    return (
        s.address,
        s.capacity.SerializeToString(deterministic=True),
        s.allocated.SerializeToString(deterministic=True),
        s.instances,
        tuple((m.digest, m.tier) for m in s.models),
    )


def _new_life(old: common_pb2.NodeStatus, new: common_pb2.NodeStatus) -> bool:
    """Whether new comes from another incarnation of old's agent (0 = an
    agent that does not report one: then only a seq going back tells)."""
    return bool(old.incarnation and new.incarnation and old.incarnation != new.incarnation)


class NodeRegistry:
    """Nodes known to one ClusterMgr instance.

    dead_after_s: silence after which a node is declared dead (default three
    heartbeats of 1 s). A node is due (dead) at exactly its last beat +
    dead_after_s; ``next_deadline()`` says when the next one falls due, so
    a caller can wake then instead of sweeping periodically. The clock must
    not go backward (the deadlines are kept in the order of the beats).
    """

    def __init__(self, *, dead_after_s: float = 3.0, clock: Clock | None = None) -> None:
        if dead_after_s <= 0:
            raise ValueError("dead_after_s must be > 0")
        self.dead_after_s = dead_after_s
        self.clock = clock or MonotonicClock()
        self.membership = MembershipView()
        self._nodes: dict[str, NodeRecord] = {}
        # Alive nodes, oldest last beat first: every beat moves its node to
        # the end, so the first one holds the earliest deadline (O(1) per
        # beat and per look, where a scan would cost O(nodes) per beat).
        self._by_beat: OrderedDict[str, None] = OrderedDict()

    # ----- reads -----------------------------------------------------------

    def get(self, node_id: str) -> NodeRecord | None:
        """The record of a node, if known."""
        return self._nodes.get(node_id)

    def records(self) -> list[NodeRecord]:
        """Every known node (alive or dead), in registration order."""
        return list(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def next_deadline(self) -> float | None:
        """When the alive node silent the longest falls due (its last beat +
        dead_after_s), on the registry's clock; None with no alive node."""
        for nid in self._by_beat:
            return self._nodes[nid].last_seen + self.dead_after_s
        return None

    def owner(self, node_id: str) -> common_pb2.ControlInstance | None:
        """The Schedule instance that owns node_id under the membership."""
        return self.membership.owner(SCHEDULE, node_id)

    # ----- writes ----------------------------------------------------------

    def register(self, status: common_pb2.NodeStatus) -> Registered:
        """A node announced itself. Registration is authoritative: it is
        recorded even if its seq is lower (a restarted agent counts again
        from the start)."""
        now = self.clock.now()
        rec = self._nodes.get(status.node_id)
        copy = common_pb2.NodeStatus()
        copy.CopyFrom(status)
        self._beat(status.node_id)
        if rec is None:
            self._nodes[status.node_id] = NodeRecord(copy, now, True, self._owner_id(copy.node_id))
            return Registered.NEW
        restarted = status.seq < rec.status.seq or _new_life(rec.status, status)
        rec.status, rec.last_seen, rec.alive = copy, now, True
        return Registered.RESTARTED if restarted else Registered.REFRESHED

    def update(self, status: common_pb2.NodeStatus) -> Updated:
        """A heartbeat. A lower seq than known is ignored (reordered)."""
        rec = self._nodes.get(status.node_id)
        if rec is None:
            return Updated.UNKNOWN
        if status.seq < rec.status.seq:
            return Updated.STALE
        old = rec.status
        # The scalar fields first: a heartbeat usually differs in them, and
        # then the serialized resources need not be compared.
        changed = (
            status.instances != old.instances
            or status.address != old.address
            or _content(status) != _content(old)
        )
        rec.status = common_pb2.NodeStatus()
        rec.status.CopyFrom(status)
        rec.last_seen = self.clock.now()
        self._beat(status.node_id)
        if not rec.alive:
            rec.alive = True
            return Updated.REVIVED
        return Updated.CHANGED if changed else Updated.SAME

    def dead_nodes(self, now: float | None = None) -> list[NodeRecord]:
        """Alive nodes due at ``now``: silent for dead_after_s or longer
        (not marked), oldest beat first."""
        t = self.clock.now() if now is None else now
        due = []
        for nid in self._by_beat:
            r = self._nodes[nid]
            # The same sum as next_deadline(): a wake-up at that deadline
            # finds the node due, whatever the rounding.
            if t < r.last_seen + self.dead_after_s:
                break  # the rest beat later
            due.append(r)
        return due

    def mark_dead(self, now: float | None = None) -> list[NodeRecord]:
        """Declare ``dead_nodes(now)`` dead and return them. They stay listed
        (not alive) until they heartbeat again or are forgotten."""
        dead = self.dead_nodes(now)
        for r in dead:
            r.alive = False
            del self._by_beat[r.status.node_id]
        return dead

    def forget(self, node_id: str) -> NodeRecord | None:
        """Drop a node entirely; returns its record."""
        self._by_beat.pop(node_id, None)
        return self._nodes.pop(node_id, None)

    def _beat(self, node_id: str) -> None:
        # Heard from now: the latest deadline of all (the clock only moves on).
        self._by_beat[node_id] = None
        self._by_beat.move_to_end(node_id)

    def set_membership(self, m: common_pb2.Membership) -> list[OwnerChange] | None:
        """Adopt a membership. Returns the nodes whose Schedule owner changed
        (only those: rendezvous moves ~1/(n+1) of them when one instance is
        added), or None when m is not newer than the current one."""
        if not self.membership.update(m):
            return None
        changes = []
        for nid, rec in self._nodes.items():
            new = self._owner_id(nid)
            if new != rec.owner:
                changes.append(OwnerChange(nid, rec.owner, new))
                rec.owner = new
        return changes

    def not_mine(self, my_id: str) -> list[str]:
        """Nodes that, under the membership, belong to another ClusterMgr
        instance (empty when my_id is not a member: then nothing is known
        about how nodes are split)."""
        if self.membership.get(CLUSTERMGR, my_id) is None:
            return []
        return [
            nid
            for nid in self._nodes
            if (o := self.membership.owner(CLUSTERMGR, nid)) is not None and o.id != my_id
        ]

    def _owner_id(self, node_id: str) -> str:
        o = self.membership.owner(SCHEDULE, node_id)
        return o.id if o is not None else ""
