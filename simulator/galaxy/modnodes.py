"""ClusterMgr's ModNodes calls to Schedule, as production's outbox makes them.

``functions/clustermgr/outbox.py`` keeps one queue per Schedule address in
which the newest status per node replaces an unsent one. A change sends the
queue at once; a queue of refreshes only (unchanged statuses) lingers up to
a heartbeat period (the servicer's default) for company. While a call is in
flight what arrives waits and goes with the next call, up to ``BATCH``
statuses per call, and the round goes on until the queue is empty. So a
lone change costs a whole call, and a burst (a repartition's re-sends, many
changes while Schedule is busy) shares calls.

Charged per call: ClusterMgr the client side of a unary call
(``clustermgr.modnodes``); Schedule a unary call (``schedule.modnodes``)
plus ``schedule.upsert`` per status. The queues are this model's (the
outbox is asyncio I/O); what Schedule does with each status is the
production ``PlacementPolicy.upsert`` (``ControlPlane.apply_modnode``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from functions.clustermgr.outbox import BATCH
from functions.schedule.model import NodeInfo
from galaxy.v1 import common_pb2

if TYPE_CHECKING:
    from simulator.galaxy.control import ClusterMgrInst, ControlPlane, ScheduleInst

#: A queued status: the status as sent and Schedule's view of it (None:
#: converted when applied).
Item = tuple[common_pb2.NodeStatus, NodeInfo | None]

_IDLE, _WAITING, _IN_FLIGHT = 0, 1, 2


class _Queue:
    """One ClusterMgr instance's queue for one Schedule instance."""

    __slots__ = ("cmf", "items", "send_at", "sf", "state", "token", "urgent")

    def __init__(self, cmf: ClusterMgrInst, sf: ScheduleInst) -> None:
        self.cmf, self.sf = cmf, sf
        self.items: dict[str, Item] = {}
        self.state = _IDLE
        #: bumped to void a scheduled send (a linger cut short)
        self.token = 0
        self.send_at = 0.0
        #: a change is queued: send without lingering
        self.urgent = False


class ModNodes:
    """Every ClusterMgr instance's outbox: queues, calls and their costs."""

    def __init__(self, cp: ControlPlane, linger_s: float, batch: int = BATCH) -> None:
        self.cp = cp
        self.sim, self.net = cp.sim, cp.net
        self.linger_s = linger_s
        self.batch = batch
        env = cp.env
        self.s_client = env.op("clustermgr.modnodes")
        self.s_call = env.op("schedule.modnodes")
        self.s_status = env.op("schedule.upsert")
        self._queues: dict[tuple[str, str], _Queue] = {}
        #: ModNodes calls made and statuses they carried
        self.calls = 0
        self.sent = 0

    def put(
        self,
        cmf: ClusterMgrInst,
        sf: ScheduleInst,
        status: common_pb2.NodeStatus,
        info: NodeInfo | None = None,
        *,
        urgent: bool = True,
    ) -> None:
        """Queue a status from cmf for sf, now (``Outbox.put``): urgent=False
        for a refresh of an unchanged status, which may linger."""
        key = (cmf.id, sf.id)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue(cmf, sf)
        # Newest wins, and goes to the end (as the outbox's OrderedDict).
        q.items.pop(status.node_id, None)
        q.items[status.node_id] = (status, info)
        if urgent:
            q.urgent = True
        if q.state == _IN_FLIGHT:
            return  # goes with the next call, when this one returns
        now = self.sim.now
        if q.urgent:
            if q.state == _WAITING and q.send_at <= now:
                return  # a send is due now: it takes this one too
            self._arm(q, now)
        elif q.state == _IDLE:
            self._arm(q, now + self.linger_s)

    def _arm(self, q: _Queue, t: float) -> None:
        q.state = _WAITING
        q.token += 1
        q.send_at = t
        self.sim.at(t, self._send, (q, q.token))

    def _send(self, a: tuple[_Queue, int]) -> None:
        q, token = a
        if token != q.token:
            return  # voided: an urgent status sent the queue earlier
        items = q.items
        if not items:
            q.state = _IDLE
            return
        q.state = _IN_FLIGHT
        q.urgent = False
        q.token += 1
        n = min(self.batch, len(items))
        keys = list(items)[:n] if n < len(items) else list(items)
        batch = [items.pop(k) for k in keys]
        self.calls += 1
        self.sent += n
        t = q.cmf.station.finish(self.sim.now, self.s_client()) + self.net.hop()
        service = self.s_call()
        for _ in range(n):
            service += self.s_status()
        self.sim.stage(t, q.sf.station, service, self._served, (q, batch))

    def _served(self, a: tuple[_Queue, list[Item]]) -> None:
        q, batch = a
        upsert = self.cp.apply_modnode
        for status, info in batch:
            upsert((q.sf, status, info))
        self.sim.at(self.sim.now + self.net.hop(), self._replied, q)

    def _replied(self, q: _Queue) -> None:
        # The outbox sends what arrived meanwhile at once (the round is paid
        # for), refreshes too.
        if q.items:
            q.token += 1
            self._send((q, q.token))
        else:
            q.state = _IDLE
