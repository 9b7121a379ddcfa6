"""Dispatch gRPC servicer: a thin adapter over FunctionRouter.

Owns routing for the functions that rendezvous-hash to this instance; a
request for another function is forwarded once to its owner. Scale-ups go to
the Schedule instance that the function hashes to, spilling to the next ones
on RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from prometheus_client import Counter, Gauge

from controlplane.runtime import authn, rpc, validation
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    ResourceExhausted,
)
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.revisions import routing_key
from functions.dispatch import coordination, fnstats, revisions, starts, stream, waits
from functions.dispatch.autoscale import AutoscaleSettings, FunctionAutoscaling
from functions.dispatch.backoff import BackoffConfig, StartBackoff
from functions.dispatch.config import DEFAULTS
from functions.dispatch.ownership import Ownership, lease_revision
from functions.dispatch.peers import Peers
from functions.dispatch.policy import FunctionRouter, Grant, Instance, QueueFull, Waiter
from functions.dispatch.specs import SpecCache
from functions.dispatch.waits import MAX_WAIT_S
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc

log = logging.getLogger(__name__)

# How long a Release forwarded to the owner may take when the caller set no
# deadline: one hop to a peer, which answers from memory.
FORWARD_RELEASE_S = 10.0


DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
# A call with less time left than this gets no slot: its answer would likely
# arrive after the caller's own deadline (which expires first by the transit
# delay), stranding the slot until its lease ends.
GRANT_MARGIN_S = 0.005
RecordFn = Callable[[str, bytes | None], None]
# Overload, where an operator looks for it: requests refused by reason, and
# requests waiting for a slot now (bounded by --max-queue per function).
REJECTED = Counter(
    "galaxy_dispatch_rejected_total",
    "Dispatch calls refused: queue_full, wait_timeout, deadline_too_short",
    ["reason"],
)
WAITING = Gauge("galaxy_dispatch_waiting", "Requests waiting for a slot on this instance")
fnstats.init_reasons(REJECTED)


class DispatchServicer(dispatch_pb2_grpc.DispatchServicer):
    """Routes requests to instances; see module docstring."""

    def __init__(
        self,
        *,
        instance_id: str,
        pool: rpc.ChannelPool,
        controller: str,
        clock: Clock | None = None,
        lease_ttl_s: float = DEFAULTS.lease_ttl_ms / 1000.0,
        max_queue: int = DEFAULTS.max_queue,
        max_spill: int = DEFAULTS.max_spill,
        record: RecordFn | None = None,
        autoscale: AutoscaleSettings | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.pool = pool
        self.peers = Peers(instance_id, pool, max_spill)
        self.controller = controller
        self.clock: Clock = clock or MonotonicClock()
        self.autoscaling = FunctionAutoscaling(autoscale or AutoscaleSettings(), self.clock)
        self.lease_ttl_s = lease_ttl_s
        self.max_queue = max_queue
        self.record: RecordFn = record or (lambda key, value: None)
        self.membership = MembershipView()
        self.routers: dict[str, FunctionRouter] = {}
        # Read at scrape time: no bookkeeping on the request path.
        WAITING.set_function(lambda: sum(len(r.waiters) for r in self.routers.values()))
        self.spec_cache = SpecCache(controller, lambda: self.pool)
        fnstats.attach(self)  # its instances, at every scrape
        self._specs = self.spec_cache.specs
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Handovers, recovered instances, late releases: the protocol core.
        self.ownership: Ownership[str, common_pb2.ControlInstance] = Ownership()
        self._recovered = self.ownership.recovered
        self.ops: dict[str, int] = {"dispatch": 0, "scale_up": 0, "forwarded": 0}
        # Start backoff (functions/dispatch/backoff.py); main sets its flags.
        self.backoff = StartBackoff(BackoffConfig(), self.clock)

    # -- helpers ----------------------------------------------------------

    def bind(self, address: str, pool: rpc.ChannelPool) -> None:
        """Adopt the host's address and channel pool once serving."""
        self.pool = pool
        self.peers.pool = pool
        self.peers.address = address

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    @property
    def background(self) -> int:
        """Background work under way: scale-ups, handovers, deletes."""
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel background work (scale-ups, deletes)."""
        fnstats.detach(self)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _owner(self, function: str) -> common_pb2.ControlInstance | None:
        """The Dispatch instance owning function; None means this one."""
        # Every revision of a function lives with the function.
        o = self.membership.owner(DISPATCH, routing_key(function))
        if o is None or o.id == self.instance_id:
            return None
        return o

    def routes(self, function: str) -> bool:
        """True when this instance routes function (or any of its revisions)."""
        return any(n == function or routing_key(n) == function for n in self.routers)

    def router_of(self, function: str) -> FunctionRouter:
        """The router of function, or of its newest routed revision
        (KeyError if none): what `galaxy status` and tests look at."""
        if function in self.routers:
            return self.routers[function]
        return self.routers[max(n for n in self.routers if routing_key(n) == function)]

    async def _spec(self, name: str) -> common_pb2.FunctionSpec:
        return await self.spec_cache.get(name)

    def _router(self, spec: common_pb2.FunctionSpec) -> FunctionRouter:
        r = self.routers.get(spec.name)
        if r is None:
            r = FunctionRouter(
                spec.name,
                spec.concurrency or 1,
                spec.max_scale or 1,
                self.clock,
                lease_ttl_s=self._request_timeout_s(spec),
                max_queue=self.max_queue,
                lease_prefix=f"{self.instance_id}:",
            )
            self.routers[spec.name] = r
            for info in self.ownership.take_recovered(spec.name):
                self._add(r, info, cold=False)
        return r

    def _request_timeout_s(self, spec: common_pb2.FunctionSpec) -> float:
        """The function's request timeout: how long a request may wait for a
        slot, and its lease's lifetime (the Dispatch default when unset)."""
        return spec.request_timeout_ms / 1000.0 if spec.request_timeout_ms else self.lease_ttl_s

    def _release_if_abandoned(
        self, context: grpc.aio.ServicerContext, router: FunctionRouter, lease_id: str
    ) -> None:
        """Free the slot if the answer never reaches the caller: a deadline
        that expires (or a cancel) between the grant and the answer's
        delivery leaves no one to Release it, so it would be held for the
        whole lease."""

        def done(ctx: grpc.aio.ServicerContext) -> None:
            if ctx.cancelled() and self.routers.get(router.name) is router:
                self._wake(router.release(lease_id)[1])

        context.add_done_callback(done)

    def _reply(
        self, g: Grant, wait_s: float, ttl_s: float, hold_s: float = 0.0
    ) -> dispatch_pb2.InstanceAddr:
        return dispatch_pb2.InstanceAddr(
            function=g.instance.meta.function if g.instance.meta else "",
            instance_id=g.instance.instance_id,
            address=g.instance.address,
            node_id=g.instance.node_id,
            lease_id=g.lease_id,
            cold_start=g.cold_start,
            wait_ms=wait_s * 1000.0,
            lease_ttl_ms=int(ttl_s * 1000),
            hold_ms=int(hold_s * 1000),
        )

    @staticmethod
    def _wake(grants: list[tuple[Waiter, Grant]]) -> None:
        for w, g in grants:
            fut: asyncio.Future[Grant] = w.token
            if not fut.done():
                fut.set_result(g)

    # -- public API -------------------------------------------------------

    @fnstats.recorded
    async def Dispatch(
        self, request: dispatch_pb2.DispatchRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.InstanceAddr:
        validation.check_dispatch(request)
        # Piggybacked releases first: the slot they free may serve this request.
        self.release_many(request.releases)
        owner = self._owner(request.function)
        if owner is not None and not request.forwarded:
            if self.ownership.handing_over(request.function):
                owner = await coordination.held(self, request.function)
            return await self._forward(owner, request, context)
        start = time.perf_counter()
        self.ops["dispatch"] += 1
        spec, router, hold = await revisions.resolve(self, request)
        rid = request.request_id
        grant = router.granted_for(rid)
        if grant is not None:  # a retry of a request already served
            return self._reply(grant, time.perf_counter() - start, router.lease_ttl_s)
        remaining = context.time_remaining()
        if remaining is not None and remaining < GRANT_MARGIN_S:
            # Granted now, the answer would reach the caller after it gave
            # up (its deadline runs out before ours: the transit delay), and
            # no one would Release the slot.
            REJECTED.labels("deadline_too_short").inc()
            raise DeadlineExceeded(
                f"dispatch {validation.short(request.function)}: deadline too short"
            )
        grant = router.acquire()
        if grant is not None:
            router.remember(rid, grant)
            self._release_if_abandoned(context, router, grant.lease_id)
            return self._reply(grant, time.perf_counter() - start, router.lease_ttl_s, hold())
        # Start backoff: only a start could serve this request, and none may go now.
        failing = self.backoff.blocked(spec.name, spec.version)
        if failing is not None and not router.live_count() and not router.pending:
            raise FailedPrecondition(failing.message(spec.name, self.clock.now()))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Grant] = loop.create_future()
        try:
            waiter = router.enqueue(fut)
        except QueueFull as e:
            REJECTED.labels("queue_full").inc()
            raise ResourceExhausted(str(e)) from None
        self._trigger_scale_up(router, spec)
        remaining = context.time_remaining()
        # router.lease_ttl_s is the function's request timeout.
        timeout = waits.wait_timeout_s(remaining, router.lease_ttl_s)
        try:
            grant = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except coordination.Moved as moved:
            # Repartitioned while waiting: the new owner serves it (one hop).
            return await self._forward(moved.owner, request, context)
        except TimeoutError:
            if router.cancel(waiter):
                REJECTED.labels("wait_timeout").inc()
                raise DeadlineExceeded(
                    f"no instance of {validation.short(request.function)} became free within "
                    f"{timeout:.2f}s ({router.pending} starting, "
                    f"{router.live_count()}/{router.max_scale} running); retry later"
                ) from None
            grant = fut.result()  # served just as the timer fired
        except asyncio.CancelledError:
            # The caller went away: give up the place in the queue or the slot.
            if not router.cancel(waiter) and fut.done() and not fut.exception():
                self._wake(router.release(fut.result().lease_id)[1])
            raise
        router.remember(rid, grant)
        self._release_if_abandoned(context, router, grant.lease_id)
        return self._reply(grant, time.perf_counter() - start, router.lease_ttl_s, hold())

    async def _forward(
        self,
        owner: common_pb2.ControlInstance,
        request: dispatch_pb2.DispatchRequest,
        context: grpc.aio.ServicerContext,
    ) -> dispatch_pb2.InstanceAddr:
        self.ops["forwarded"] += 1
        fwd = dispatch_pb2.DispatchRequest()
        fwd.CopyFrom(request)
        fwd.forwarded = True
        remaining = context.time_remaining()
        # The owner checks the caller's namespace: it has the spec.
        md = authn.forwarded_metadata(context)
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                return await s.Dispatch(  # type: ignore[no-any-return]
                    fwd, timeout=MAX_WAIT_S if remaining is None else remaining, metadata=md
                )
        except grpc.aio.AioRpcError as e:
            await self._forward_failed(owner, e, context, "forwarded dispatch failed")
            raise  # unreachable: _forward_failed aborts

    async def _forward_failed(
        self,
        owner: common_pb2.ControlInstance,
        e: grpc.aio.AioRpcError,
        context: grpc.aio.ServicerContext,
        what: str,
    ) -> None:
        """End the caller's RPC with the owner's status (never INTERNAL)."""
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            # The owner may be dead: have the controller check it now, so
            # the function moves here (or elsewhere) without waiting for
            # the owner to fall silent.
            self.peers.report_unreachable(self.controller, owner)
        code = e.code()
        if code == grpc.StatusCode.CANCELLED:
            # The owner is stopping and its grace ran out on this call
            # (our own cancellation raises CancelledError instead): tell
            # the caller to try again, as for an owner that is gone.
            code = grpc.StatusCode.UNAVAILABLE
        await context.abort(code, e.details() or what)

    DispatchStream = stream.serve  # each message served by Dispatch above

    async def Release(
        self, request: dispatch_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.ReleaseReply:
        validation.check_release(request)
        # The lease id names the revision its slot is filed under; the
        # function field is only checked (a client may send the function's
        # name or the revision's: either is the same owner).
        fn = lease_revision(request.lease_id)
        if fn is None:
            return dispatch_pb2.ReleaseReply(released=False)  # no Dispatch issued it
        owner = self._owner(fn)
        if owner is not None and not request.forwarded:
            fwd = dispatch_pb2.ReleaseRequest(
                function=fn, lease_id=request.lease_id, forwarded=True
            )
            remaining = context.time_remaining()
            try:
                async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                    return await s.Release(  # type: ignore[no-any-return]
                        fwd, timeout=FORWARD_RELEASE_S if remaining is None else remaining
                    )
            except grpc.aio.AioRpcError as e:
                await self._forward_failed(owner, e, context, "forwarded release failed")
                raise  # unreachable: _forward_failed aborts
        known = self._release(fn, request.lease_id)
        return dispatch_pb2.ReleaseReply(released=known)

    async def _forward_release(
        self, owner: common_pb2.ControlInstance, rel: dispatch_pb2.ReleaseRequest
    ) -> None:
        fwd = dispatch_pb2.ReleaseRequest(lease_id=rel.lease_id, forwarded=True)
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                await s.Release(fwd, timeout=FORWARD_RELEASE_S)
        except grpc.aio.AioRpcError as e:
            log.warning("forwarding release %s failed: %s", rel.lease_id, e.details())

    def release_many(self, releases: Iterable[dispatch_pb2.ReleaseRequest]) -> None:
        """Releases that ride on another message (checked by the caller)."""
        for rel in releases:
            fn = lease_revision(rel.lease_id)
            if fn is not None:  # else no Dispatch issued it: nothing to free
                elsewhere = self._owner(fn)
                if elsewhere is None:
                    self._release(fn, rel.lease_id)
                else:  # the caller's view is stale: pass it on
                    self._spawn(self._forward_release(elsewhere, rel))

    def _release(self, function: str, lease_id: str) -> bool:
        """Return a slot on a function this instance routes; False if unknown."""
        known, grants = self.ownership.release(self.routers.get(function), lease_id)
        self._wake(grants)
        return known

    # -- scale-up ---------------------------------------------------------

    def _trigger_scale_up(self, router: FunctionRouter, spec: common_pb2.FunctionSpec) -> None:
        n = router.scale_ups_needed()
        if n and not self.backoff.blocked(spec.name, spec.version):  # start backoff
            router.begin_scale_up(n)
            for _ in range(n):
                self._spawn(self._scale_up(router, spec))

    async def _scale_up(self, router: FunctionRouter, spec: common_pb2.FunctionSpec) -> None:
        """One instance start already counted in router.pending (``starts``)."""
        await starts.scale_up(self, router, spec)

    def _add(
        self,
        router: FunctionRouter,
        info: common_pb2.InstanceInfo,
        cold: bool,
        leases: list[str] | None = None,
    ) -> bool:
        """Route a started, handed-over (with ``leases``) or recovered instance."""
        if self.routers.get(router.name) is not router:
            # The function moved, or was deleted (and maybe redeployed), while
            # this instance started: give it to whoever routes it now, after
            # it served the waiters kept here for it (``ownership``).
            owner = self._owner(router.name)
            current = self.routers.get(router.name)
            if cold and (owner is not None or current is not None):
                leases = coordination.late_start_done(self, router, info)
            if owner is not None:
                self._spawn(self.peers.send_instance(owner, info, leases or []))
                return False
            if current is None:
                self._spawn(self.peers.delete_on_node(info))
                return False
            router, cold = current, False  # the new router never counted it pending
        if info.instance_id in router.instances:
            if cold and router.surplus_starts:
                router.surplus_starts -= 1
            elif cold:
                router.pending = max(0, router.pending - 1)
            if leases:  # a repeated handover: its leases (known ones are skipped)
                self._wake(router.add_instance(router.instances[info.instance_id], leases=leases))
            return False
        inst = Instance(
            info.instance_id,
            info.address,
            info.node_id,
            info.concurrency or router.concurrency,
            meta=info,
        )
        grants = router.scale_up_done(inst) if cold else router.add_instance(inst, leases=leases)
        self._wake(grants)
        self.record(
            f"/galaxy/instances/{info.function}/{info.instance_id}", info.SerializeToString()
        )
        return True

    def _remove(self, router: FunctionRouter, instance_id: str) -> Instance | None:
        inst = router.remove_instance(instance_id)
        if inst is not None:
            self._unrouted(router.name, instance_id)
        return inst

    def _unrouted(self, function: str, instance_id: str) -> None:
        """An instance left the routing tables: its record goes."""
        self.record(f"/galaxy/instances/{function}/{instance_id}", None)

    async def recover(self, records: list[common_pb2.InstanceInfo]) -> int:
        """Adopt instances recorded by a previous incarnation that still run;
        returns how many (see ``coordination.recover``)."""
        return await coordination.recover(self, records)

    # -- internal API -----------------------------------------------------

    async def ModInstance(
        self, request: dispatch_pb2.ModInstanceRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.ModInstanceReply:
        return await coordination.mod_instance(self, request)

    async def Coordinate(
        self, request: common_pb2.CoordinateRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CoordinateReply:
        return await coordination.coordinate(self, request)

    async def ListInstances(
        self, request: dispatch_pb2.ListInstancesRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.ListInstancesReply:
        return coordination.list_instances(self, request)

    # -- housekeeping -----------------------------------------------------

    def autoscale_tick(self) -> None:
        """Apply one round of function autoscaling (run every tick_s)."""
        idle = revisions.inactive(self)
        if idle:
            revisions.retire_inactive(self, idle)
        active = {n: r for n, r in self.routers.items() if n not in idle}
        for d in self.autoscaling.tick(active, self._specs):
            router = self.routers[d.function]
            if d.start and not self.backoff.blocked(d.function, self._specs[d.function].version):
                spec = self._specs[d.function]  # (a scaler decided: the spec is known)
                router.begin_scale_up(d.start)
                for _ in range(d.start):
                    self._spawn(self._scale_up(router, spec))
            for iid in d.retire:
                # Out of the routing tables first, then off the node.
                router.drain(iid)
                inst = self._remove(router, iid)
                if inst is not None and inst.meta is not None:
                    log.info("retiring %s: %s", iid, d.reason)
                    self._spawn(self.peers.delete_on_node(inst.meta))

    def expire_leases(self) -> None:
        """Release slots whose holders never called Release (run periodically)."""
        for r in self.routers.values():
            self._wake(r.expire_leases())
