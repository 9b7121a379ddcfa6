"""Membership pushes (``Coordinate``) from the controller to control functions.

Only instances whose own partition or downstream set changed get a push: a
Dispatch instance routes by the Dispatch and Schedule members, a ClusterMgr
instance by the ClusterMgr and Schedule members (and needs the Dispatch
members to report dead nodes), a Schedule instance by the
Schedule members (``RELEVANT``). The coordinator remembers what each instance
was last sent and pushes again only when that part of its view changed, so
adding a Dispatch instance costs no message to Schedule or ClusterMgr.

Pushes go out in rounds, one round at a time, always with the latest view,
so a burst of registrations coalesces and no push overtakes a newer one. A
failed push is retried in a later round.

A new Schedule instance warms before it takes traffic (``warm``): the first
round shows it to ClusterMgr and the other Schedule instances only (see
``registry.WARM_AUDIENCE``), ClusterMgr sends it the nodes of its partition,
and once it holds them it becomes READY and the next round tells Dispatch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from controlplane.controller.registry import (
    CLUSTERMGR,
    DISPATCH,
    SCHEDULE,
    ControlRegistry,
    Member,
    State,
)
from controlplane.runtime import rendezvous, rpc
from controlplane.runtime.membership import KIND_NAMES
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    dispatch_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)
from statestore import StateStore, StoreError

#: How long a new instance may take to become warm (``ControllerConfig``'s
#: ``--warm-timeout-s`` default).
WARM_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)

COORDINATE_STUBS: dict[int, Any] = {
    DISPATCH: dispatch_pb2_grpc.DispatchStub,
    SCHEDULE: schedule_pb2_grpc.ScheduleStub,
    CLUSTERMGR: clustermgr_pb2_grpc.ClusterMgrStub,
}
#: The member kinds each kind's instances route by (own partition + downstream).
RELEVANT: dict[int, frozenset[int]] = {
    DISPATCH: frozenset({DISPATCH, SCHEDULE}),
    SCHEDULE: frozenset({SCHEDULE}),
    # Dispatch too: ClusterMgr tells every Dispatch instance when a node dies.
    CLUSTERMGR: frozenset({CLUSTERMGR, SCHEDULE, DISPATCH}),
}
Signature = tuple[tuple[int, str, str], ...]
MemberKey = tuple[int, str, str]


def signature(m: common_pb2.Membership, kinds: frozenset[int]) -> Signature:
    """The part of a membership an instance routing by ``kinds`` depends on."""
    return tuple(sorted((i.kind, i.id, i.address) for i in m.instances if i.kind in kinds))


def _key(info: common_pb2.ControlInstance) -> MemberKey:
    return (info.kind, info.id, info.address)


class Coordinator:
    """Pushes membership views; see the module docstring.

    store/prefix: when set (high-availability mode), the READY and WARMING
    members are mirrored under ``prefix`` so a newly elected controller
    starts from the same membership.
    """

    def __init__(
        self,
        registry: ControlRegistry,
        pool: rpc.ChannelPool,
        *,
        timeout_s: float = 2.0,
        retry_s: float = 0.5,
        warm_timeout_s: float = WARM_TIMEOUT_S,
        store: StateStore | None = None,
        prefix: str = "",
    ) -> None:
        self.registry = registry
        self.pool = pool
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.warm_timeout_s = warm_timeout_s
        self.store = store
        self.prefix = prefix
        #: Whether this controller may push (a follower must not).
        self.active: Callable[[], bool] = lambda: True
        self._sent: dict[MemberKey, Signature] = {}
        self._persisted: dict[str, bytes] = {}
        self._dirty = asyncio.Event()
        self._round = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the background pusher."""
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="membership-pusher")

    async def stop(self) -> None:
        """Stop pushing and warming."""
        tasks = [*self._tasks, *([self._loop] if self._loop else [])]
        self._loop = None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def mark_dirty(self) -> None:
        """Membership changed: push in the next round."""
        self._dirty.set()

    def registered(self, info: common_pb2.ControlInstance, sent: common_pb2.Membership) -> None:
        """An instance registered and got ``sent`` as its reply."""
        self._sent[_key(info)] = signature(sent, RELEVANT.get(info.kind, frozenset()))
        self.mark_dirty()
        m = self.registry.get(info.kind, info.id)
        if m is not None and m.state is State.WARMING:
            self.spawn(self.warm(m))

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a coroutine owned by the coordinator (cancelled by stop)."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- pushing ------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not self.active():
                continue
            failed = await self.sync()
            if failed:
                # Retry later; a timer here is a backoff, not synchronisation.
                await asyncio.sleep(self.retry_s)
                self._dirty.set()

    async def sync(self) -> int:
        """Push to every instance whose relevant view changed and wait for
        the answers; returns how many pushes failed."""
        async with self._round:
            members = self.registry.members()
            jobs = []
            for m in members:
                kinds = RELEVANT.get(m.info.kind)
                if kinds is None:
                    continue
                view = self.registry.membership(m.info.kind)
                sig = signature(view, kinds)
                if self._sent.get(_key(m.info)) != sig:
                    jobs.append(self._push(m.info, view, sig))
            live = {_key(m.info) for m in members}
            for k in [k for k in self._sent if k not in live]:
                del self._sent[k]
            results = await asyncio.gather(*jobs)
            await self._persist(members)
            return sum(1 for ok in results if not ok)

    async def _push(
        self, inst: common_pb2.ControlInstance, view: common_pb2.Membership, sig: Signature
    ) -> bool:
        ok = await self.coordinate(inst, common_pb2.CoordinateRequest(membership=view))
        if ok:
            self._sent[_key(inst)] = sig
        return ok

    async def coordinate(
        self, inst: common_pb2.ControlInstance, req: common_pb2.CoordinateRequest
    ) -> bool:
        """Send one Coordinate; False (logged) when it failed."""
        stub_cls = COORDINATE_STUBS.get(inst.kind)
        if stub_cls is None:
            return False
        try:
            async with self.pool.stub(inst.address, stub_cls) as stub:
                await stub.Coordinate(req, timeout=self.timeout_s)
            return True
        except grpc.aio.AioRpcError as e:
            log.warning(
                "Coordinate to %s %s failed: %s", KIND_NAMES[inst.kind], inst.id, e.details()
            )
            return False

    async def _persist(self, members: list[Member]) -> None:
        # Mirror the membership for a successor controller (HA mode only).
        if self.store is None or not self.active():
            return
        want = {
            f"{self.prefix}{KIND_NAMES[m.info.kind]}/{m.info.id}": m.info.SerializeToString()
            for m in members
            # A standby is not part of the membership: a successor learns of
            # it when it reports (and registers again, as a standby).
            if m.state is not State.DRAINING and m.state is not State.STANDBY
        }
        try:
            stale = [k for k in self._persisted if k not in want]
            if stale:
                await self.store.delete_many(stale)
            changed = [(k, v) for k, v in want.items() if self._persisted.get(k) != v]
            for i in range(0, len(changed), self.store.max_txn_ops):
                await self.store.put_many(changed[i : i + self.store.max_txn_ops])
            self._persisted = want
        except StoreError as e:
            log.warning("could not mirror the membership to the state store: %s", e)

    # -- warming ------------------------------------------------------------

    async def warm(self, m: Member) -> None:
        """Let a new Schedule instance learn its partition, then make it READY."""
        info = m.info
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self.sync()  # ClusterMgr and the Schedule instances learn of it
        nodes = await self._alive_nodes()
        expected: set[str] = set()
        have: set[str] = set()
        deadline = start + self.warm_timeout_s
        while loop.time() < deadline:
            # Recomputed each time: another instance warming at once takes
            # part of this one's share.
            expected = self._owned(nodes, info.id)
            have = await self._held_nodes(info)
            if expected <= have:
                break
            # The nodes arrive from ClusterMgr in another process; nothing
            # here can be awaited, so look again shortly (bounded above).
            await asyncio.sleep(0.02)
        if not expected <= have:
            log.warning(
                "schedule %s holds %d of %d nodes after %.1fs; taking traffic anyway",
                info.id,
                len(expected & have),
                len(expected),
                self.warm_timeout_s,
            )
        cur = self.registry.get(info.kind, info.id)
        if cur is None or cur.info.address != info.address:
            return  # gone, or replaced by a restart, meanwhile
        self.registry.set_state(info.kind, info.id, State.READY)
        await self.sync()  # now Dispatch sends it placements
        log.info(
            "schedule %s warm with %d nodes in %.0f ms; taking traffic",
            info.id,
            len(expected),
            (loop.time() - start) * 1000,
        )

    def _owned(self, nodes: set[str], schedule_id: str) -> set[str]:
        """The nodes that rendezvous-hash to schedule_id now."""
        owners = [i.id for i in self.registry.membership(SCHEDULE).instances if i.kind == SCHEDULE]
        return {n for n in nodes if rendezvous.owner(n, owners) == schedule_id}

    async def _alive_nodes(self) -> set[str]:
        """Alive nodes, per ClusterMgr."""
        nodes: set[str] = set()
        for cm in self.registry.members(CLUSTERMGR, State.READY):
            try:
                async with self.pool.stub(cm.info.address, clustermgr_pb2_grpc.ClusterMgrStub) as s:
                    r = await s.ListNodes(
                        clustermgr_pb2.ListClusterNodesRequest(), timeout=self.timeout_s
                    )
            except grpc.aio.AioRpcError as e:
                log.info("warm-up: ListNodes of clustermgr %s failed: %s", cm.info.id, e.details())
                continue
            nodes.update(n.status.node_id for n in r.nodes if n.alive)
        return nodes

    async def _held_nodes(self, info: common_pb2.ControlInstance) -> set[str]:
        try:
            async with self.pool.stub(info.address, schedule_pb2_grpc.ScheduleStub) as s:
                r = await s.ListNodes(schedule_pb2.ListNodesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError:
            return set()
        return {n.node_id for n in r.nodes}
