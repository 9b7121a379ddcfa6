"""One Dispatch instance's state and decisions: ``Dispatcher``.

The gRPC servicer (``service.py``) is a thin adapter over it: it validates a
request, calls one of the methods below and maps the result (or the
``GalaxyError`` raised) to the reply. The helpers that perform the pure
cores' actions (``coordination``, ``revisions``, ``starts``) use only this
public interface. docs/components/dispatch.md lists it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from controlplane.runtime import rpc, validation
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.errors import DeadlineExceeded, FailedPrecondition, ResourceExhausted
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.revisions import routing_key
from functions.dispatch import (
    admission,
    arrivals,
    coordination,
    fnstats,
    llmroute,
    llmsleep,
    memberchange,
    revisions,
    starts,
    waits,
)
from functions.dispatch.autoscale import AutoscaleSettings, FunctionAutoscaling
from functions.dispatch.backoff import BackoffConfig, StartBackoff
from functions.dispatch.config import DEFAULTS
from functions.dispatch.ownership import Ownership, lease_revision
from functions.dispatch.peers import Peers
from functions.dispatch.policy import FunctionRouter, Grant, Instance, QueueFull, Waiter
from functions.dispatch.specs import SpecCache
from functions.dispatch.startneed import StartPace
from galaxy.v1 import common_pb2, dispatch_pb2

log = logging.getLogger(__name__)

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
    "Dispatch calls refused: queue_full, wait_timeout, deadline_too_short, shed (admission "
    "by SLO class at overload)",
    ["reason"],
)
WAITING = Gauge("galaxy_dispatch_waiting", "Requests waiting for a slot on this instance")
fnstats.init_reasons(REJECTED)


@dataclass(frozen=True)
class Served:
    """A slot granted to one request (``Dispatcher.serve``)."""

    grant: Grant
    router: FunctionRouter
    #: seconds from the request's arrival to the grant
    wait_s: float
    #: the function's request timeout: the lease's lifetime
    ttl_s: float
    #: seconds the caller may hold the lease for later requests
    hold_s: float
    #: False for a retry of a request already served (nothing new was leased)
    fresh: bool


def first_free_id(records: Iterable[common_pb2.InstanceInfo], dispatch_id: str) -> int:
    """The first instance number above every recorded one this Dispatch
    instance named (``Dispatcher.new_instance_id``)."""
    mine = f"-{dispatch_id}-"
    taken = [r.instance_id.rpartition(mine)[2] for r in records if mine in r.instance_id]
    return max((int(n) + 1 for n in taken if n.isdigit()), default=0)


class Dispatcher:
    """Routes the functions this Dispatch instance owns: their routers, the
    starts and deletes of their instances, handovers to and from peers."""

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
        llm_picker: str = DEFAULTS.llm_picker,
    ) -> None:
        self.instance_id = instance_id
        #: the channel pool of the host (a placeholder until ``bind``)
        self.pool = pool
        #: outbound calls: Schedule, node agents, peers, the controller
        self.peers = Peers(instance_id, pool, max_spill)
        self.controller = controller
        self.clock: Clock = clock or MonotonicClock()
        #: pickers and scraped signals of the LLM functions routed here
        self.llm = llmroute.LlmRouting(self.clock, llm_picker)
        #: instances of LLM functions a scale-in put to sleep
        self.sleeping = llmsleep.Sleeping(self.clock)
        self.admission = admission.Admission()
        self.autoscaling = FunctionAutoscaling(
            autoscale or AutoscaleSettings(), self.clock, self.llm.fleet
        )
        #: starts of a function that keep failing back off (main sets the flags)
        self.backoff = StartBackoff(BackoffConfig(), self.clock)
        #: a lease's lifetime for functions without a request timeout
        self.lease_ttl_s = lease_ttl_s
        self.max_queue = max_queue
        #: writes (or, with None, deletes) an instance record in the store
        self.record: RecordFn = record or (lambda key, value: None)
        self.membership = MembershipView()
        self.peers.view = self.membership
        #: one router per function (or revision) this instance routes
        self.routers: dict[str, FunctionRouter] = {}
        # Read at scrape time: no bookkeeping on the request path.
        WAITING.set_function(lambda: sum(len(r.waiters) for r in self.routers.values()))
        self.spec_cache = SpecCache(controller, lambda: self.pool)
        fnstats.attach(self)  # its instances, at every scrape
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: handovers, recovered instances, late releases: the protocol core
        self.ownership: Ownership[str, common_pb2.ControlInstance] = Ownership()
        #: requests routed here, instance starts, requests forwarded
        self.ops: dict[str, int] = {"dispatch": 0, "scale_up": 0, "forwarded": 0}

    # -- lifecycle --------------------------------------------------------

    def bind(self, address: str, pool: rpc.ChannelPool) -> None:
        """Adopt the host's address and channel pool once serving."""
        self.pool = pool
        self.peers.pool = pool
        self.peers.address = address

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background (cancelled by ``close``)."""
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    @property
    def background(self) -> int:
        """Background work under way: scale-ups, handovers, deletes."""
        return len(self._tasks)

    async def settle(self) -> None:
        """Wait for the background work under way now (tests, shutdown)."""
        await asyncio.gather(*list(self._tasks))

    async def close(self) -> None:
        """Cancel background work (scale-ups, deletes)."""
        fnstats.detach(self)
        await self.llm.close()
        await self.sleeping.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- who routes what --------------------------------------------------

    def owner(self, function: str) -> common_pb2.ControlInstance | None:
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

    def membership_changed(self, m: common_pb2.Membership) -> bool:
        """Adopt membership ``m`` if it is newer (from the controller's
        Coordinate or a load report's reply) and do what the change asks,
        in ``memberchange``'s order; True when adopted."""
        if not self.membership.update(m):
            return False
        work = memberchange.membership_changed(
            self.ownership, self.routers, self.owner, self.peers.credits, self.peers.grantor_owns
        )
        if work.refill:  # a busy holder refills at once
            self.peers.refill()
        coordination.perform(self, work.actions)
        return True

    @property
    def specs(self) -> dict[str, common_pb2.FunctionSpec]:
        """The cached specs, by function or revision name."""
        return self.spec_cache.specs

    async def spec(self, name: str) -> common_pb2.FunctionSpec:
        """The spec of a function or revision (cached; the controller's)."""
        return await self.spec_cache.get(name)

    def router(self, spec: common_pb2.FunctionSpec) -> FunctionRouter:
        """The router of ``spec``'s function, made (with the instances
        recovered for it) on first use."""
        r = self.routers.get(spec.name)
        if r is None:
            r = FunctionRouter(
                spec.name,
                spec.concurrency or 1,
                spec.max_scale or 1,
                self.clock,
                lease_ttl_s=self.request_timeout_s(spec),
                max_queue=self.max_queue,
                lease_prefix=f"{self.instance_id}:",
                pace=StartPace(),
            )
            self.routers[spec.name] = r
            for info in self.ownership.take_recovered(spec.name):
                self.add(r, info, cold=False)
        return r

    def request_timeout_s(self, spec: common_pb2.FunctionSpec) -> float:
        """The function's request timeout: how long a request may wait for a
        slot, and its lease's lifetime (the Dispatch default when unset)."""
        return spec.request_timeout_ms / 1000.0 if spec.request_timeout_ms else self.lease_ttl_s

    # -- slots ------------------------------------------------------------

    async def serve(
        self, request: dispatch_pb2.DispatchRequest, remaining: Callable[[], float | None]
    ) -> Served:
        """A slot for one request of a function this instance routes,
        waiting (and starting instances) when none is free. ``remaining``
        gives the caller's time left (None: no deadline). Raises
        ``DeadlineExceeded``/``ResourceExhausted`` when refused, and
        ``coordination.Moved`` when the function moved while it waited."""
        start = time.perf_counter()
        self.ops["dispatch"] += 1
        spec, router, hold = await revisions.resolve(self, request)
        rid = request.request_id
        grant = router.granted_for(rid)
        if grant is not None:  # a retry of a request already served
            return Served(
                grant, router, time.perf_counter() - start, router.lease_ttl_s, 0.0, False
            )
        left = remaining()
        if left is not None and left < GRANT_MARGIN_S:
            # Granted now, the answer would reach the caller after it gave
            # up (its deadline runs out before ours: the transit delay), and
            # no one would Release the slot.
            REJECTED.labels("deadline_too_short").inc()
            raise DeadlineExceeded(
                f"dispatch {validation.short(request.function)}: deadline too short"
            )
        if spec.llm or router.waiters:  # (else nothing is queued: nothing to shed)
            self._admit(request, spec, router)
        grant = self.llm.acquire(router, spec, request.hint)
        self.autoscaling.served(spec.name)
        if grant is None:
            # Start backoff: only a start could serve this request, and none may go now.
            failing = self.backoff.blocked(spec.name, spec.version)
            if failing is not None and not router.live_count() and not router.pending:
                raise FailedPrecondition(failing.message(spec.name, self.clock.now()))
            grant = await self._wait(request, spec, router, remaining)
        router.remember(rid, grant)
        wait_s = time.perf_counter() - start
        return Served(grant, router, wait_s, router.lease_ttl_s, hold(), True)

    def _admit(
        self,
        request: dispatch_pb2.DispatchRequest,
        spec: common_pb2.FunctionSpec,
        router: FunctionRouter,
    ) -> None:
        """Shed the request by its SLO class when the function is overloaded
        (``admission``): RESOURCE_EXHAUSTED naming why."""
        rate = self.llm.latency(router.name).first_tokens_per_s if spec.llm else 0.0
        verdict = self.admission.decide(
            request.hint.priority,
            ttft_s=spec.autoscaling.ttft_ms / 1000.0,
            queued=self.llm.waiting(router) if spec.llm else len(router.waiters),
            first_tokens_per_s=rate,
            queue_bound=router.max_queue,
        )
        if not verdict.admit:
            REJECTED.labels("shed").inc()
            self.llm.shed(router.name)  # still demand, for the autoscaler
            raise ResourceExhausted(
                f"dispatch {validation.short(request.function)}: {verdict.reason}"
            )

    async def _wait(
        self,
        request: dispatch_pb2.DispatchRequest,
        spec: common_pb2.FunctionSpec,
        router: FunctionRouter,
        remaining: Callable[[], float | None],
    ) -> Grant:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Grant] = loop.create_future()
        try:
            waiter = router.enqueue(fut)
        except QueueFull as e:
            REJECTED.labels("queue_full").inc()
            raise ResourceExhausted(str(e)) from None
        self.trigger_scale_up(router, spec)
        # router.lease_ttl_s is the function's request timeout.
        timeout = waits.wait_timeout_s(remaining(), router.lease_ttl_s)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if router.cancel(waiter):
                REJECTED.labels("wait_timeout").inc()
                raise DeadlineExceeded(
                    f"no instance of {validation.short(request.function)} became free within "
                    f"{timeout:.2f}s ({router.pending} starting, "
                    f"{router.live_count()}/{router.max_scale} running); retry later"
                ) from None
            return fut.result()  # served just as the timer fired
        except asyncio.CancelledError:
            # The caller went away: give up the place in the queue or the slot.
            if not router.cancel(waiter) and fut.done() and not fut.exception():
                self.wake(router.release(fut.result().lease_id)[1])
            raise

    def abandoned(self, router: FunctionRouter, lease_id: str) -> None:
        """The answer granting ``lease_id`` never reached its caller (its
        deadline expired or it cancelled): free the slot, which no one will
        Release."""
        if self.routers.get(router.name) is router:
            self.wake(router.release(lease_id)[1])

    @staticmethod
    def wake(grants: list[tuple[Waiter, Grant]]) -> None:
        """Hand granted slots to their waiting requests."""
        for w, g in grants:
            fut: asyncio.Future[Grant] = w.token
            if not fut.done():
                fut.set_result(g)

    def release_many(self, releases: Iterable[dispatch_pb2.ReleaseRequest]) -> None:
        """Releases that ride on another message (checked by the caller)."""
        for rel in releases:
            fn = lease_revision(rel.lease_id)
            if fn is not None:  # else no Dispatch issued it: nothing to free
                elsewhere = self.owner(fn)
                if elsewhere is None:
                    self.release(fn, rel.lease_id)
                else:  # the caller's view is stale: pass it on
                    self.spawn(self.peers.forward_release(elsewhere, rel.lease_id))

    def release(self, function: str, lease_id: str) -> bool:
        """Return a slot on a function this instance routes; False if unknown."""
        known, grants = self.ownership.release(self.routers.get(function), lease_id)
        self.wake(grants)
        return known

    def expire_leases(self) -> None:
        """Release slots whose holders never called Release (run periodically)."""
        for r in self.routers.values():
            self.wake(r.expire_leases())

    # -- instances --------------------------------------------------------

    def trigger_scale_up(self, router: FunctionRouter, spec: common_pb2.FunctionSpec) -> None:
        """Start the instances ``router``'s waiters need now."""
        n = router.scale_ups_needed()
        if n and not self.backoff.blocked(spec.name, spec.version):  # start backoff
            self.start(router, spec, n)

    def start(self, router: FunctionRouter, spec: common_pb2.FunctionSpec, n: int) -> None:
        """Start ``n`` instances of ``spec`` for ``router`` (counted pending
        at once; each placed in the background, ``starts.scale_up``), less
        the sleeping instances woken first (``llmsleep.wake``)."""
        n -= llmsleep.wake(self, router, spec, n)
        if n <= 0:
            return
        router.begin_scale_up(n)
        for _ in range(n):
            self.spawn(starts.scale_up(self, router, spec))

    def new_instance_id(self, spec: common_pb2.FunctionSpec) -> str:
        """A fresh id for an instance of ``spec`` started by this instance."""
        return f"{spec.name}-{self.instance_id}-{next(self._ids)}"

    def add(
        self,
        router: FunctionRouter,
        info: common_pb2.InstanceInfo,
        cold: bool,
        leases: list[str] | None = None,
    ) -> bool:
        """Route a started (``cold``), handed-over (with ``leases``) or
        recovered instance that arrives for ``router``; True when it is new
        here. Where it goes is ``arrivals.decide``'s decision."""
        if cold:  # just started: its node's agent answers there now
            self.peers.agent_seen(info.node_id, info.node_address)
        a = arrivals.decide(router, self.routers.get(router.name), self.owner(router.name), cold)
        if a.late:
            leases = coordination.late_start_done(self, router, info)
        if a.owner is not None:
            self.spawn(self.peers.send_instance(a.owner, info, leases or []))
            return False
        if a.route is None:
            self.spawn(self.peers.delete_on_node(info))
            return False
        if a.late:  # as a handover brings them: those released meanwhile stay free
            leases = self.ownership.unreleased(leases or [])
        conc = info.concurrency or a.route.concurrency
        inst = Instance(info.instance_id, info.address, info.node_id, conc, meta=info)
        new, grants = arrivals.join(a.route, inst, a.cold, leases)
        self.wake(grants)
        if new:
            self.record(
                f"/galaxy/instances/{info.function}/{info.instance_id}", info.SerializeToString()
            )
        return new

    def remove(self, router: FunctionRouter, instance_id: str) -> Instance | None:
        """Take an instance out of the routing tables (and its record)."""
        inst = router.remove_instance(instance_id)
        if inst is not None:
            self.unrouted(router.name, instance_id)
        return inst

    def unrouted(self, function: str, instance_id: str) -> None:
        """An instance left the routing tables: its record goes."""
        self.record(f"/galaxy/instances/{function}/{instance_id}", None)

    async def recover(self, records: list[common_pb2.InstanceInfo]) -> int:
        """Adopt instances recorded by a previous incarnation that still run;
        returns how many (see ``coordination.recover``). New instance ids
        count on from the highest recorded one of this instance's: a start
        under the id of one still running (a sleeping instance's, say) would
        join it instead of starting one."""
        self._ids = itertools.count(first_free_id(records, self.instance_id))
        return await coordination.recover(self, records)

    async def check_routed(self) -> int:
        """Unroute the instances their node agents do not run; returns how
        many (``coordination.check_routed``). Run every ``routedcheck.CHECK_S``."""
        return await coordination.check_routed(self)

    def autoscale_tick(self) -> None:
        """Apply one round of function autoscaling (run every tick_s)."""
        idle = revisions.inactive(self)
        if idle:
            revisions.retire_inactive(self, idle)
        active = {n: r for n, r in self.routers.items() if n not in idle}
        for d in self.autoscaling.tick(active, self.specs):
            router = self.routers[d.function]
            spec = self.specs[d.function]  # (a scaler decided: the spec is known)
            if d.start and not self.backoff.blocked(d.function, spec.version):  # start backoff
                log.info("scaling %s out by %d: %s", d.function, d.start, d.reason)
                self.start(router, spec, d.start)
            for iid in d.retire:
                # Out of the routing tables first, then off the node.
                router.drain(iid)
                if llmsleep.retire(self, router, spec, iid):
                    continue  # asleep: out of the routing tables, still running
                inst = self.remove(router, iid)
                if inst is not None and inst.meta is not None:
                    log.info("retiring %s: %s", iid, d.reason)
                    self.spawn(self.peers.delete_on_node(inst.meta))
        llmsleep.tick(self)
