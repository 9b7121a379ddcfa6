"""ClusterMgr's ModNodes calls to Schedule, made as production's outbox
makes them: the queueing is production's own ``OutboxQueue``
(``functions/clustermgr/outbox_queue.py``, which the asyncio ``Outbox``
drives too), one per ClusterMgr instance and Schedule instance. This module
only times it on the simulated clock: the wake-ups the queue asks for, the
calls through the stations, their charges.

The queue's rules, in short: the newest status per node replaces an unsent
one; news sends the queue at once, a status that may wait (a refresh of an
unchanged status, or a start the owner's view already counts: how long is
production's ``HeartbeatForwarding.wait_s``, a heartbeat period by
default) waits up to that for company; while a call is in flight what
arrives waits and goes with the next call, up to ``BATCH`` statuses per
call, and the round goes on until the queue is empty. So a lone free costs
a whole call, a start mostly rides with the next call to its Schedule
instance, and a burst (a repartition's re-sends, many changes while
Schedule is busy) shares calls.
Calls do not fail in the model, so the queue's retries never happen, and
the model sends no REMOVE, so no REMOVE + UPSERT reset either.

Charged per call: ClusterMgr the client side of a unary call
(``clustermgr.modnodes``); Schedule a unary call (``schedule.modnodes``)
plus ``schedule.upsert`` per status. What Schedule does with each status
is the production ``PlacementPolicy.upsert`` (``ControlPlane.apply_modnode``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from functions.clustermgr.outbox_queue import BATCH, Entry, OutboxQueue
from functions.schedule.model import NodeInfo
from galaxy.v1 import common_pb2

if TYPE_CHECKING:
    from simulator.galaxy.control import ClusterMgrInst, ControlPlane, ScheduleInst

#: A queued status: the status as sent and Schedule's view of it (None:
#: converted when applied).
Item = tuple[common_pb2.NodeStatus, NodeInfo | None]


class _Queue:
    """One ClusterMgr instance's queue for one Schedule instance, and the
    wake-up scheduled for it."""

    __slots__ = ("cmf", "q", "sf", "token")

    def __init__(self, cmf: ClusterMgrInst, sf: ScheduleInst, q: OutboxQueue[Item]) -> None:
        self.cmf, self.sf, self.q = cmf, sf, q
        #: bumped to void a scheduled wake-up (a linger cut short)
        self.token = 0


class ModNodes:
    """Every ClusterMgr instance's outbox: queues, calls and their costs."""

    def __init__(self, cp: ControlPlane, batch: int = BATCH) -> None:
        self.cp = cp
        self.sim, self.net = cp.sim, cp.net
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
        wait_s: float = 0.0,
    ) -> None:
        """Queue a status from cmf for sf, now (``Outbox.put``): it may wait
        up to wait_s for company."""
        key = (cmf.id, sf.id)
        s = self._queues.get(key)
        if s is None:
            q: OutboxQueue[Item] = OutboxQueue(batch=self.batch)
            s = self._queues[key] = _Queue(cmf, sf, q)
        t = s.q.put(status.node_id, (status, info), now=self.sim.now, wait_s=wait_s)
        if t is not None:
            self._arm(s, t)

    def _arm(self, s: _Queue, t: float) -> None:
        s.token += 1
        self.sim.at(t, self._send, (s, s.token))

    def _send(self, a: tuple[_Queue, int]) -> None:
        s, token = a
        if token != s.token:
            return  # voided: a status due sooner sent the queue earlier
        r = s.q.poll(self.sim.now)
        if r is None:
            return  # idle
        if not isinstance(r, list):
            self._arm(s, r)  # (after a backoff; calls do not fail here)
            return
        s.token += 1
        n = len(r)
        self.calls += 1
        self.sent += n
        t = s.cmf.station.finish(self.sim.now, self.s_client()) + self.net.hop()
        service = self.s_call()
        for _ in range(n):
            service += self.s_status()
        self.sim.stage(t, s.sf.station, service, self._served, (s, r))

    def _served(self, a: tuple[_Queue, list[Entry[Item]]]) -> None:
        s, batch = a
        upsert = self.cp.apply_modnode
        sf = s.sf
        for e in batch:
            status, info = e.item
            upsert((sf, status, info))
        self.sim.at(self.sim.now + self.net.hop(), self._replied, s)

    def _replied(self, s: _Queue) -> None:
        # The queue sends what arrived meanwhile at once (the round is paid
        # for), refreshes too.
        t = s.q.sent(self.sim.now)
        if t is not None:
            s.token += 1
            self._send((s, s.token))
