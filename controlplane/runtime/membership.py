"""A control function instance's view of the membership, and owners from it.

Pure: no I/O. Every component that routes by partition (Dispatch forwarding,
ClusterMgr to Schedule, node agents to ClusterMgr, the SDK) holds one.
"""

from __future__ import annotations

from controlplane.runtime import rendezvous
from galaxy.v1 import common_pb2

Kind = int  # a common_pb2.ControlKind value

KIND_NAMES: dict[int, str] = {
    common_pb2.CONTROL_KIND_DISPATCH: "dispatch",
    common_pb2.CONTROL_KIND_SCHEDULE: "schedule",
    common_pb2.CONTROL_KIND_CLUSTERMGR: "clustermgr",
    common_pb2.CONTROL_KIND_CONTROLLER: "controller",
}
KIND_BY_NAME: dict[str, int] = {v: k for k, v in KIND_NAMES.items()}

#: Node heartbeat period, ms: what ClusterMgr tells node agents by default
#: (``ClusterMgrConfig``) and what an agent uses until told (``NodeAgentConfig``).
NODE_HEARTBEAT_MS = 1000
#: Maximum age of a node heartbeat stream (ClusterMgr.Heartbeats), seconds:
#: ClusterMgr ends older streams and node agents open a new one at this age.
HEARTBEAT_STREAM_MAX_AGE_S = 60.0


class MembershipView:
    """The latest membership this process has seen (older epochs are ignored)."""

    def __init__(self) -> None:
        self.epoch = 0
        self._by_kind: dict[int, dict[str, common_pb2.ControlInstance]] = {}

    def update(self, m: common_pb2.Membership) -> bool:
        """Adopt m if it is newer; returns True when adopted."""
        if m.epoch < self.epoch or (m.epoch == self.epoch and self.epoch != 0):
            return False
        by_kind: dict[int, dict[str, common_pb2.ControlInstance]] = {}
        for inst in m.instances:
            by_kind.setdefault(inst.kind, {})[inst.id] = inst
        self._by_kind = by_kind
        self.epoch = m.epoch
        return True

    def ids(self, kind: Kind) -> list[str]:
        """Instance ids of a kind, sorted."""
        return sorted(self._by_kind.get(kind, {}))

    def get(self, kind: Kind, instance_id: str) -> common_pb2.ControlInstance | None:
        """The instance of kind with that id, if a member."""
        return self._by_kind.get(kind, {}).get(instance_id)

    def instances(self, kind: Kind) -> list[common_pb2.ControlInstance]:
        """Instances of a kind, sorted by id."""
        d = self._by_kind.get(kind, {})
        return [d[i] for i in sorted(d)]

    def owner(self, kind: Kind, key: str) -> common_pb2.ControlInstance | None:
        """The instance of kind that owns key (rendezvous), or None if none."""
        d = self._by_kind.get(kind, {})
        o = rendezvous.owner(key, d)
        return d[o] if o is not None else None

    def ranked(self, kind: Kind, key: str) -> list[common_pb2.ControlInstance]:
        """Instances of kind in spill order for key (owner first)."""
        d = self._by_kind.get(kind, {})
        return [d[i] for i in rendezvous.ranked(key, d)]
