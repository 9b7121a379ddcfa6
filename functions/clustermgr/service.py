"""ClusterMgr gRPC servicer: a thin adapter around ``NodeRegistry``.

Heartbeats are answered at once; telling the owning Schedule instance
(ModNode) happens off that path through an outbox: one queue per Schedule
address in which the newest message per node replaces an unsent older one,
drained by one task per address. So messages for a node reach its owner in
order, and a slow Schedule instance costs coalescing, not memory or latency
of heartbeats. News goes at once; refreshes of unchanged statuses wait up
to a heartbeat period for company, so that they cost Schedule one RPC per
period rather than one per beat (docs/results/benchmarks-2026-11.md, 2026-11-26,
"Schedule per heartbeat", commit 5538adf), and so do statuses whose change
the owner's view already counts (an instance it placed starting or ready:
``functions/clustermgr/forwarding.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.membership import NODE_HEARTBEAT_MS
from controlplane.runtime.metrics import HEARTBEAT_BATCH_STATUSES, NODE_RESTARTS, NODES
from functions.clustermgr import heartbeats
from functions.clustermgr.forwarding import HeartbeatForwarding
from functions.clustermgr.outbox import Outbox
from functions.clustermgr.policy import (
    CLUSTERMGR,
    SCHEDULE,
    NodeRecord,
    NodeRegistry,
    Registered,
    Updated,
)
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    dispatch_pb2_grpc,
    schedule_pb2,
)

log = logging.getLogger(__name__)

SERVICE_NAME = clustermgr_pb2.DESCRIPTOR.services_by_name["ClusterMgr"].full_name
UPSERT = schedule_pb2.ModNodeRequest.OP_UPSERT
REMOVE = schedule_pb2.ModNodeRequest.OP_REMOVE
NODE_KEY_PREFIX = "/galaxy/nodes/"

# What a heartbeat status is answered (ClusterMgrServicer._heartbeat).
_OK, _REVIVED, _REREGISTER, _WRONG_OWNER = 0, 1, 2, 3

#: Write-behind hook: (key, serialized value or None to delete).
Record = Callable[[str, bytes | None], None]


def node_key(node_id: str) -> str:
    """State store key of a node record."""
    return NODE_KEY_PREFIX + node_id


class ClusterMgrServicer(clustermgr_pb2_grpc.ClusterMgrServicer):
    """The ClusterMgr API of one instance.

    heartbeat_s: interval told to node agents. record: write-behind hook for
    node records (key ``/galaxy/nodes/<node_id>``, NodeStatus bytes; None =
    delete); it must not block. ``bind(id, pool)`` when they are known only
    once the server is up; ``start()`` arms the liveness timer.
    """

    def __init__(
        self,
        registry: NodeRegistry,
        *,
        clustermgr_id: str = "",
        pool: rpc.ChannelPool | None = None,
        heartbeat_s: float = NODE_HEARTBEAT_MS / 1000.0,
        record: Record | None = None,
        modnode_timeout_s: float = 2.0,
        refresh_linger_s: float | None = None,
        covered_linger_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.heartbeat_s = heartbeat_s
        self._record_fn = record
        self.outbox = Outbox(pool or rpc.ChannelPool(), timeout_s=modnode_timeout_s)
        self.clustermgr_id = clustermgr_id
        self.modnode_timeout_s = modnode_timeout_s
        #: RegisterNode calls and heartbeat statuses (Update, one on
        #: Heartbeats or in a batch) received: the load reporter's rate.
        self.node_updates = 0
        #: Limits of Heartbeats streams (max age; tests shorten it).
        self.stream = heartbeats.StreamLimits()
        #: Which heartbeats go on to Schedule, and how long each may wait
        #: for company (shared with the simulator). Refreshes wait up to a
        #: heartbeat period (None): at most one ModNodes RPC of them per
        #: period and Schedule instance, and a refresh (itself due every
        #: REFRESH_BEATS periods) at most one late; covered statuses (None)
        #: up to COVERED_BEATS periods.
        self.forwarding = HeartbeatForwarding(
            heartbeat_s, refresh_linger_s=refresh_linger_s, covered_linger_s=covered_linger_s
        )
        #: The liveness timer: armed for the registry's next deadline (None:
        #: not started, or no alive node to wait for).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the deadline it is armed for (registry clock)
        self._started = False
        self._background: set[asyncio.Task[None]] = set()

    def bind(self, clustermgr_id: str, pool: rpc.ChannelPool) -> None:
        """Set this instance's id and channel pool."""
        self.clustermgr_id = clustermgr_id
        self.outbox.pool = pool

    # ----- API ---------------------------------------------------------------

    async def RegisterNode(
        self, request: common_pb2.NodeStatus, context: grpc.aio.ServicerContext
    ) -> clustermgr_pb2.UpdateReply:
        if not request.node_id:
            raise InvalidArgument("node_id must be set")
        if not request.address:
            raise InvalidArgument("address must be set (the node agent's host:port)")
        if not request.HasField("capacity"):
            raise InvalidArgument("capacity must be set")
        self.node_updates += 1
        if not self._owns(request.node_id):
            return self._wrong_owner(request.node_id)
        outcome = self.registry.register(request)
        rec = self.registry.get(request.node_id)
        assert rec is not None
        if outcome is Registered.RESTARTED:
            self._tell_owner(rec, REMOVE)  # so the owner accepts the lower seq
            # The old life's instances died with it: Dispatch stops routing
            # to them now (as for a dead node) instead of sending requests
            # to ghosts until the node would be declared dead, which a quick
            # restart never lets happen.
            log.warning("node %s restarted: its previous instances ended", request.node_id)
            NODE_RESTARTS.inc()
            self._tell_dispatch([request.node_id])
        self._tell_owner(rec, UPSERT)
        # The owner has it now: its next unchanged beat is no news (as the
        # simulator, which registers through the forwarding rule).
        self.forwarding.sent(rec.status.node_id, self.registry.clock.now())
        self._record(rec.status.node_id, rec.status)
        self._gauges()
        self._arm()
        return self._reply()

    async def Update(
        self, request: common_pb2.NodeStatus, context: grpc.aio.ServicerContext
    ) -> clustermgr_pb2.UpdateReply:
        return self.update(request)

    async def Heartbeats(
        self,
        request_iterator: AsyncIterator[common_pb2.NodeStatus],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[clustermgr_pb2.HeartbeatReply]:
        """Update for every status on one stream (functions/clustermgr/heartbeats.py)."""
        async for reply in heartbeats.serve(self.update, request_iterator, context, self.stream):
            yield reply

    async def HeartbeatBatches(
        self,
        request_iterator: AsyncIterator[clustermgr_pb2.NodeStatusBatch],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[clustermgr_pb2.HeartbeatBatchReply]:
        """update_batch for every batch on one stream (heartbeats.serve_batches)."""
        async for reply in heartbeats.serve_batches(
            self.update_batch, request_iterator, context, self.stream
        ):
            yield reply

    def update(self, request: common_pb2.NodeStatus) -> clustermgr_pb2.UpdateReply:
        """A heartbeat (Update, or one status on Heartbeats). Raises
        InvalidArgument for a status without node_id."""
        if not request.node_id:
            raise InvalidArgument("node_id must be set")
        answer = self._heartbeat(request)
        if answer == _REVIVED:
            self._arm()
        if answer == _WRONG_OWNER:
            return self._wrong_owner(request.node_id)
        return self._reply(reregister=answer == _REREGISTER)

    def update_batch(
        self, batch: clustermgr_pb2.NodeStatusBatch, reopen: bool = False
    ) -> clustermgr_pb2.HeartbeatBatchReply:
        """The statuses of a batch (HeartbeatBatches) in one pass, each
        handled as ``update`` would; one HeartbeatReply per status, in
        order. Raises InvalidArgument (heartbeats.check_batch) before
        handling any status of a bad batch."""
        problem = heartbeats.check_batch(batch)
        if problem is not None:
            raise InvalidArgument(problem)
        HEARTBEAT_BATCH_STATUSES.observe(len(batch.statuses))
        out = clustermgr_pb2.HeartbeatBatchReply(reopen=reopen)
        replies = out.replies
        interval_ms = round(self.heartbeat_s * 1000)
        revived = False
        for status in batch.statuses:
            answer = self._heartbeat(status)
            r = replies.add()
            r.node_id = status.node_id
            r.reply.heartbeat_interval_ms = interval_ms
            if answer == _REREGISTER:
                r.reply.reregister = True
            elif answer == _WRONG_OWNER:
                self._forget(status.node_id)
                r.reply.wrong_owner = True
            elif answer == _REVIVED:
                revived = True
        if revived:  # once per batch, not per revived node
            self._arm()
        return out

    def _heartbeat(self, status: common_pb2.NodeStatus) -> int:
        """Apply one heartbeat status (node_id set); what to answer (_OK,
        _REVIVED, _REREGISTER, _WRONG_OWNER: the caller forgets the node)."""
        self.node_updates += 1
        if not self._owns(status.node_id):
            return _WRONG_OWNER
        known = self.registry.get(status.node_id)
        old = known.status if known is not None else None  # (update replaces it)
        outcome = self.registry.update(status)
        if outcome is Updated.UNKNOWN:
            return _REREGISTER
        if outcome is Updated.STALE:
            return _OK
        rec = self.registry.get(status.node_id)
        assert rec is not None
        wait = self.forwarding.wait_s(outcome, old, rec.status, self.registry.clock.now())
        if wait is not None:
            self._tell_owner(rec, UPSERT, wait_s=wait)
        if outcome is not Updated.SAME:
            self._record(rec.status.node_id, rec.status)
        return _REVIVED if outcome is Updated.REVIVED else _OK

    async def Coordinate(
        self, request: common_pb2.CoordinateRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CoordinateReply:
        if request.HasField("membership"):
            self.apply_membership(request.membership)
        return common_pb2.CoordinateReply(epoch=self.registry.membership.epoch)

    async def ListNodes(
        self, request: clustermgr_pb2.ListClusterNodesRequest, context: grpc.aio.ServicerContext
    ) -> clustermgr_pb2.ListClusterNodesReply:
        now = self.registry.clock.now()
        nodes = [
            clustermgr_pb2.ClusterNode(
                status=r.status,
                alive=r.alive,
                last_seen_ms=(now - r.last_seen) * 1000.0,
                schedule_id=r.owner,
            )
            for r in self.registry.records()
        ]
        return clustermgr_pb2.ListClusterNodesReply(clustermgr_id=self.clustermgr_id, nodes=nodes)

    # ----- membership and liveness ------------------------------------------

    def apply_membership(self, m: common_pb2.Membership) -> None:
        """Adopt a newer membership: re-send the nodes whose Schedule owner
        changed to their new owner, and forget (without declaring them dead)
        the nodes another ClusterMgr instance now manages: their agents
        follow the same membership and heartbeat there."""
        before = {i.id: i.address for i in self.registry.membership.instances(SCHEDULE)}
        changes = self.registry.set_membership(m)
        if changes is None:
            return
        # A Schedule instance back at a new address (restarted) holds no
        # nodes: send it its whole partition now, not at the next refresh.
        restarted = {
            i.id
            for i in self.registry.membership.instances(SCHEDULE)
            if i.id in before and before[i.id] != i.address
        }
        resend = {c.node_id for c in changes} | {
            r.status.node_id for r in self.registry.records() if r.owner in restarted
        }
        for nid in resend:
            rec = self.registry.get(nid)
            if rec is not None and rec.alive:
                self._tell_owner(rec, UPSERT)
        moved = self.registry.not_mine(self.clustermgr_id)
        for nid in moved:
            self.registry.forget(nid)
            self.forwarding.forget(nid)
        log.info(
            "clustermgr %s: membership epoch %d, %d nodes changed schedule owner, "
            "%d moved to another clustermgr",
            self.clustermgr_id,
            m.epoch,
            len(changes),
            len(moved),
        )
        self._gauges()

    def check_liveness(self) -> list[str]:
        """Declare silent nodes dead: tell their owners (OP_REMOVE) and delete
        their records. Returns their ids. Called by the liveness timer."""
        dead = self.registry.mark_dead()
        for rec in dead:
            nid, after = rec.status.node_id, self.registry.dead_after_s
            log.warning("node %s is dead (silent for more than %.1fs)", nid, after)
            self._tell_owner(rec, REMOVE)
            self._record(rec.status.node_id, None)
        if dead:
            self._gauges()
            self._tell_dispatch([r.status.node_id for r in dead])
        return [r.status.node_id for r in dead]

    async def start(self) -> None:
        """Start declaring nodes dead: a timer for the registry's next
        deadline, so a node is declared dead as soon as it falls due (its
        last beat + dead_after_s), not at the next round of a sweep."""
        self._started = True
        self._arm()

    async def stop(self) -> None:
        """Stop the liveness timer and the outbox."""
        self._started = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.outbox.close()

    def _arm(self) -> None:
        """Arm the timer for the next deadline unless it fires by then. A
        beat only moves deadlines later, so the timer is re-armed when it
        fires (or when a node becomes alive, which may bring one earlier):
        it wakes about once per dead_after_s - heartbeat, not per beat."""
        if not self._started:
            return
        due = self.registry.next_deadline()
        if due is None:
            return  # nothing alive to wait for; a registration arms it
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        # The registry's clock and the loop's may differ (uvloop ticks in
        # milliseconds): a delay, not an absolute time, carries over.
        delay = max(0.0, due - self.registry.clock.now())
        self._timer_at = due
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.check_liveness()
        except Exception:  # the timer must survive a bug in one round
            log.exception("liveness check failed")
        finally:
            self._arm()

    # ----- helpers -----------------------------------------------------------

    def _tell_dispatch(self, node_ids: list[str]) -> None:
        """Every Dispatch instance may route to instances on a dead node (they
        are partitioned by function, not node): tell them all, best effort."""
        req = common_pb2.CoordinateRequest(
            actions=[
                common_pb2.CoordinateAction(
                    kind=common_pb2.CoordinateAction.KIND_NODE_DEAD, node_id=n
                )
                for n in node_ids
            ]
        )
        for d in self.registry.membership.instances(common_pb2.CONTROL_KIND_DISPATCH):
            task = asyncio.create_task(self._send_node_dead(d, req))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_node_dead(
        self, d: common_pb2.ControlInstance, req: common_pb2.CoordinateRequest
    ) -> None:
        try:
            async with self.outbox.pool.stub(d.address, dispatch_pb2_grpc.DispatchStub) as s:
                await s.Coordinate(req, timeout=self.modnode_timeout_s)
        except grpc.aio.AioRpcError as e:
            log.warning("telling dispatch %s about dead nodes failed: %s", d.id, e.details())

    def _owns(self, node_id: str) -> bool:
        """Whether this instance manages node_id under its membership (True
        while it is not a member yet: nothing says how nodes are split)."""
        m = self.registry.membership
        if m.get(CLUSTERMGR, self.clustermgr_id) is None:
            return True
        owner = m.owner(CLUSTERMGR, node_id)
        return owner is None or owner.id == self.clustermgr_id

    def _forget(self, node_id: str) -> None:
        # A node agent with a stale membership: record nothing (a record here
        # would linger as a dead node) and send it to the owner.
        self.registry.forget(node_id)
        self.forwarding.forget(node_id)

    def _wrong_owner(self, node_id: str) -> clustermgr_pb2.UpdateReply:
        self._forget(node_id)
        reply = self._reply()
        reply.wrong_owner = True
        return reply

    def _reply(self, reregister: bool = False) -> clustermgr_pb2.UpdateReply:
        return clustermgr_pb2.UpdateReply(
            reregister=reregister, heartbeat_interval_ms=round(self.heartbeat_s * 1000)
        )

    def _tell_owner(
        self, rec: NodeRecord, op: schedule_pb2.ModNodeRequest.Op, *, wait_s: float = 0.0
    ) -> None:
        owner = self.registry.membership.get(SCHEDULE, rec.owner) if rec.owner else None
        if owner is None:
            return  # no Schedule instance yet: Coordinate will send it
        req = schedule_pb2.ModNodeRequest(op=op, node=rec.status)
        self.outbox.put(owner.address, req, wait_s=wait_s)

    def _record(self, node_id: str, status: common_pb2.NodeStatus | None) -> None:
        if self._record_fn is None:
            return
        value = None if status is None else status.SerializeToString()
        try:
            self._record_fn(node_key(node_id), value)
        except Exception:  # the state store must never break the heartbeat path
            log.exception("recording node %s failed", node_id)

    def _gauges(self) -> None:
        alive = sum(1 for r in self.registry.records() if r.alive)
        NODES.labels("alive").set(alive)
        NODES.labels("dead").set(len(self.registry) - alive)
