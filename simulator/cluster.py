"""Worker nodes shared by every system model.

Each node keeps its ledger in the production ``NodeCapacity`` (the same
object a node agent uses, so over-commit is refused exactly as on a real
node) and a status sequence number bumped on every change, like the agent's
``Node.seq``. A node agent process is a ``Station`` that serves the RPCs of
``nodes_per_agent`` nodes (1 on a real cluster, 105 in the emulated one);
sandbox starts run on a per-node station with ``create_parallelism``
servers (how many sandboxes a node boots at once).
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.nodeagent.capacity import NodeCapacity, Res
from controlplane.runtime.errors import ResourceExhausted
from functions.schedule.model import NodeInfo
from galaxy.v1 import common_pb2
from simulator.engine import Station
from simulator.host import Host

_UINT32_MAX = 2**32 - 1
#: Default node: the `galaxy up` default node (4 cores, 8 GiB).
DEFAULT_NODE = Res(4000, 8192, 0)


class SimNode:
    """One worker node."""

    __slots__ = (
        "_template",
        "address",
        "agent",
        "beat_token",
        "cap",
        "creator",
        "id",
        "index",
        "seq",
        "starting",
        "starting_of",
        "status_due",
    )

    def __init__(self, index: int, cap: Res, agent: Station, create_parallelism: int) -> None:
        self.index = index
        self.id = f"node-{index}"
        self.address = f"10.0.{index // 250}.{index % 250 + 1}:7000"
        self.cap = NodeCapacity(cap, self.id)
        self.agent = agent
        self.creator = Station(f"{self.id}/sandboxes", c=create_parallelism)
        self.seq = 1
        #: a status report (heartbeat) is scheduled and not yet sent
        self.status_due = False
        #: the scheduled report that still counts (an earlier push replaces it)
        self.beat_token = 0
        #: resources of instances allocated and not yet ready, and by instance
        self.starting = Res()
        self.starting_of: dict[str, Res] = {}
        #: the fields of ``status`` that never change (id, address, capacity)
        self._template = common_pb2.NodeStatus(
            node_id=self.id, address=self.address, capacity=self.cap.capacity.to_proto()
        )

    def info(self) -> NodeInfo:
        """The node's status as a probe answer (``functions.schedule`` type)."""
        return NodeInfo(
            self.id,
            self.address,
            self.cap.capacity,
            self.cap.allocated,
            self.seq,
            len(self.cap),
            self.starting,
        )

    def status(self) -> common_pb2.NodeStatus:
        """The node's status as a heartbeat (wire type, for ClusterMgr)."""
        # A copy of the fixed part, then the rest: a third of the cost of
        # building the message from keywords (one per heartbeat).
        s = common_pb2.NodeStatus()
        s.CopyFrom(self._template)
        a = self.cap.allocated
        c, m, g = a.cpu_millis, a.memory_mib, a.gpus
        if 0 <= c <= _UINT32_MAX and 0 <= m <= _UINT32_MAX and 0 <= g <= _UINT32_MAX:
            al = s.allocated  # what a.to_proto() gives, set in place
            al.cpu_millis, al.memory_mib, al.gpus = c, m, g
        else:
            s.allocated.CopyFrom(a.to_proto())
        s.instances = len(self.cap)
        s.seq = self.seq
        st = self.starting
        if st.cpu_millis or st.memory_mib or st.gpus:
            s.starting.CopyFrom(st.to_proto())
        return s

    def utilization(self) -> float:
        """Critical (highest) resource utilisation, 0..1."""
        c, a = self.cap.capacity, self.cap.allocated
        u = 0.0
        for used, total in ((a.cpu_millis, c.cpu_millis), (a.memory_mib, c.memory_mib)):
            if total > 0:
                u = max(u, used / total)
        if c.gpus > 0:
            u = max(u, a.gpus / c.gpus)
        return u


class Cluster:
    """The nodes, their agents, and a hook called when a node changes."""

    def __init__(
        self,
        n_nodes: int,
        node_res: Res = DEFAULT_NODE,
        *,
        nodes_per_agent: int = 1,
        create_parallelism: int = 8,
        host: Host | None = None,
    ) -> None:
        if n_nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.nodes: list[SimNode] = []
        self.agents: list[Station] = []
        for i in range(n_nodes):
            if i % max(1, nodes_per_agent) == 0:
                self.agents.append(Station(f"agent-{len(self.agents)}", host=host))
            self.nodes.append(SimNode(i, node_res, self.agents[-1], create_parallelism))
        self.by_id = {n.id: n for n in self.nodes}
        #: called before and after a node's allocation changes
        self.before_change: Callable[[SimNode], None] = lambda node: None
        self.on_change: Callable[[SimNode], None] = lambda node: None
        #: called after an instance's resources were freed on a node
        self.on_free: Callable[[SimNode], None] = lambda node: None
        self.live = 0

    def allocate(self, node: SimNode, instance_id: str, need: Res) -> bool:
        """Hold need on node for an instance; False when it does not fit."""
        if not node.cap.fits(need):
            return False
        self.before_change(node)
        try:
            node.cap.allocate(instance_id, need)
        except ResourceExhausted:
            return False
        node.seq += 1
        node.starting = node.starting + need
        node.starting_of[instance_id] = need
        self.live += 1
        self.on_change(node)
        return True

    def ready(self, node: SimNode, instance_id: str) -> int:
        """An instance finished starting; returns the node's seq from then
        on (statuses with a higher one count it as allocated, not starting)."""
        need = node.starting_of.pop(instance_id, None)
        if need is not None:
            node.starting = node.starting - need
            node.seq += 1
        return node.seq

    def free(self, node: SimNode, instance_id: str) -> None:
        """Release what an instance holds."""
        if not node.cap.holds(instance_id):
            return
        self.before_change(node)
        if node.cap.free(instance_id) is not None:
            need = node.starting_of.pop(instance_id, None)
            if need is not None:
                node.starting = node.starting - need
            node.seq += 1
            self.live -= 1
            self.on_change(node)
            self.on_free(node)

    def capacity_instances(self, need: Res) -> int:
        """How many instances of size need the empty cluster holds."""
        c = self.nodes[0].cap.capacity
        per = min(
            c.cpu_millis // need.cpu_millis if need.cpu_millis else 10**9,
            c.memory_mib // need.memory_mib if need.memory_mib else 10**9,
            c.gpus // need.gpus if need.gpus else 10**9,
        )
        return per * len(self.nodes)
