"""Dispatch's calls to other components: placing instances through Schedule
(with spill) or directly from a capacity credit (``functions.dispatch.credits``
decides; this module makes the CreateInstance and GrantCredits calls),
deleting them on node agents, handing them to another Dispatch
instance, checking which still run. I/O only; the routing state stays in the
servicer and its FunctionRouter policies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
from prometheus_client import Counter

from controlplane.runtime import controllers, metrics, rpc
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.credits import Grant
from controlplane.runtime.errors import (
    FailedPrecondition,
    Unavailable,
)
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.resources import Res
from controlplane.runtime.watched_creates import NodeLost, WatchedCreates
from functions.dispatch.config import DEFAULTS
from functions.dispatch.credits import Credit, CreditWallet, SyncRequest
from galaxy.v1 import (
    common_pb2,
    dispatch_pb2,
    dispatch_pb2_grpc,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)

log = logging.getLogger(__name__)

# Slack on top of a function's startup timeout for the Schedule call, which
# answers only when the instance is ready.
SCHEDULE_SLACK_S = 5.0
# Deadline of a GrantCredits exchange (off the critical path).
CREDIT_TIMEOUT_S = 2.0
SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
# How long a Release forwarded to the owner may take when the caller set no
# deadline: one hop to a peer, which answers from memory.
FORWARD_RELEASE_S = 10.0


def _owner_id(view: MembershipView, node_id: str) -> str:
    o = view.owner(SCHEDULE, node_id)
    return o.id if o is not None else ""


#: DeleteInstance calls in flight at once. Without a bound, deleting a
#: function of 5,000 instances sent 5,000 calls at once; each deadline ran
#: from the start while the calls queued behind one another, and 60% of them
#: expired unsent and were dropped (docs/reliability.md, delete-many).
DELETE_CONCURRENCY = 64
#: Attempts per delete, and the pause before the second (doubling after).
DELETE_ATTEMPTS = 4
DELETE_BACKOFF_S = 0.2
#: DeleteInstance outcomes worth another attempt: not sent, or not answered.
DELETE_RETRY_ON = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
DELETES_FAILED = Counter(
    "galaxy_dispatch_deletes_failed_total",
    "Instances Dispatch could not delete on their node agents (the agents' "
    "orphan checks stop them later), by the last error",
    ["code"],
)
STARTS_RETRIED = Counter(
    "galaxy_dispatch_starts_retried_total",
    "Starts from a capacity credit placed through Schedule instead because the "
    "credit's node was declared dead (node_dead) or its agent did not answer a "
    "probe (no_answer) while the create waited",
    ["reason"],
)


class Peers:
    """Outbound RPCs of one Dispatch instance."""

    def __init__(
        self,
        instance_id: str,
        pool: rpc.ChannelPool,
        max_spill: int = DEFAULTS.max_spill,
        credits: CreditWallet | None = None,
        delete_concurrency: int = DELETE_CONCURRENCY,
    ) -> None:
        self.instance_id = instance_id
        self.pool = pool
        self.max_spill = max_spill
        #: capacity credits (None: every start goes through Schedule)
        self.credits = credits
        #: the membership the Dispatcher keeps (``grantor_owns`` reads it)
        self.view: MembershipView | None = None
        #: Schedule RPCs sent, instances created from credits, GrantCredits calls
        self.schedule_calls = 0
        self.credit_creates = 0
        self.credit_exchanges = 0
        # Schedule instances' addresses by id (credits name their grantor),
        # and those that grant none (started with --no-credits): not asked.
        self._grantors: dict[str, str] = {}
        self._no_credits: set[str] = set()
        #: this Dispatch instance's own address (node agents notify it)
        self.address = ""
        # Unreachable reports in flight, by instance id (one at a time each).
        self._reporting: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # The wallet's counters at the last metrics update.
        self._credit_stats: dict[str, int] = {}
        # Credit exchanges in flight.
        self._exchanges: set[asyncio.Task[None]] = set()
        # DeleteInstance calls in flight (bounded), and instances not deleted.
        self._deletes = asyncio.Semaphore(delete_concurrency)
        self.deletes_failed = 0
        #: CreateInstance/DeleteInstance, on a stream per node agent
        self.agents = AgentCalls(lambda: self.pool)
        #: the creates from credits in flight, given up when their node is lost
        self.creates = WatchedCreates(self.agents, lambda: self.pool)
        # The newest node agent address seen for each node (an instance
        # just started there, a credit just granted on it): a restarted
        # agent may listen at another address than the one recorded with
        # the instances its predecessor ran. One entry per node.
        self._agent_at: dict[str, str] = {}

    def agent_seen(self, node_id: str, address: str) -> None:
        """The node's agent answers at ``address`` now (fresh news only:
        a start placed there, a credit granted on it)."""
        if node_id and address:
            self._agent_at[node_id] = address

    def agent_address(self, info: common_pb2.InstanceInfo) -> str:
        """Where the agent of ``info``'s node answers now: the newest
        address seen for the node, else the one recorded with it."""
        return self._agent_at.get(info.node_id) or info.node_address

    def report_unreachable(self, controller: str, inst: common_pb2.ControlInstance) -> None:
        """Tell the controller inst did not answer (in the background, once
        at a time per instance; the controller checks before it acts)."""
        if inst.id in self._reporting or not controller:
            return
        self._reporting.add(inst.id)
        task = asyncio.create_task(self._report(controller, inst))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, controller: str, inst: common_pb2.ControlInstance) -> None:
        try:
            r = await controllers.call(
                self.pool, controller, "ReportUnreachable", inst, timeout_s=5.0
            )
            if r.removed:
                log.warning("dispatch %s was unreachable: the controller removed it", inst.id)
        except grpc.aio.AioRpcError as e:
            log.info("could not report %s unreachable: %s", inst.id, e.code().name)
        finally:
            self._reporting.discard(inst.id)

    async def ask_schedule(
        self,
        spec: common_pb2.FunctionSpec,
        instance_id: str,
        sched: common_pb2.ControlInstance,
    ) -> common_pb2.InstanceInfo:
        """Ask one Schedule instance to place the instance (it answers once
        the instance is ready); raises the call's ``AioRpcError``."""
        req = schedule_pb2.ScheduleRequest(
            instance_id=instance_id, function=spec, notify_address=self.address
        )
        timeout = spec.startup_timeout_ms / 1000.0 + SCHEDULE_SLACK_S
        self.schedule_calls += 1
        async with self.pool.stub(sched.address, schedule_pb2_grpc.ScheduleStub) as s:
            reply = await s.Schedule(req, timeout=timeout)
        info: common_pb2.InstanceInfo = reply.instance
        return info

    # ----- capacity credits --------------------------------------------------

    async def from_credit(
        self,
        spec: common_pb2.FunctionSpec,
        instance_id: str,
        schedulers: list[common_pb2.ControlInstance],
    ) -> common_pb2.InstanceInfo | None:
        """Create the instance from a credit that fits (the agent checks its
        capacity); None when there is none or the agent refused, and the
        start goes through Schedule. A refill is asked either way, in the
        background. Raises FailedPrecondition when the agent refuses the
        spec, Unavailable when the create is in doubt (stopped there). A
        function with a model always goes through Schedule: a credit knows
        nothing of its node's model cache, Schedule's ``model_locality`` term
        does (an RPC of milliseconds against a model load of seconds)."""
        if spec.HasField("model"):
            return None
        wallet = self.credits
        assert wallet is not None
        for s in schedulers:
            self._grantors[s.id] = s.address
        t0 = time.perf_counter()
        use = wallet.take(Res.from_proto(spec.resources), spec.name)
        decided = time.perf_counter() - t0  # the placement decision, made here
        home = schedulers[0].id if schedulers else ""
        if home not in self._no_credits:
            self._sync(home, upkeep=False)
        if use is None:
            return None
        startup = spec.startup_timeout_ms / 1000.0 if spec.startup_timeout_ms else 60.0
        req = nodeagent_pb2.CreateInstanceRequest(
            node_id=use.node_id, instance_id=instance_id, function=spec,
            notify_address=self.address,
        )  # fmt: skip
        try:
            reply = await self.creates.create(
                use.node_id, use.address, req, startup + SCHEDULE_SLACK_S
            )
        except NodeLost as lost:
            wallet.settled(use, None)
            self._node_lost(use.node_id, use.address, spec.name, instance_id, lost)
            return None  # Schedule places it, on another node
        except grpc.aio.AioRpcError as e:
            refused = e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND)
            wallet.settled(use, None, refused=refused)
            if refused or e.code() == grpc.StatusCode.UNAVAILABLE:
                why = f"{e.code().name}: {(e.details() or '')[:200]}"  # "did not become ready"?
                log.info("credit on %s not usable for %s: %s", use.node_id, instance_id, why)
                return None  # not created there: Schedule places it
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise FailedPrecondition(
                    f"node agent refused the function: {e.details()}"
                ) from None
            # Past its deadline (or lost on the way back) the start may go
            # on on the node: stop it there (the same id: idempotent), or the
            # start retried through Schedule would run beside it.
            await self.delete_on_node(
                common_pb2.InstanceInfo(
                    instance_id=instance_id, function=spec.name, node_id=use.node_id,
                    node_address=use.address,
                )
            )  # fmt: skip
            raise Unavailable(
                f"creating instance {instance_id} on node {use.node_id} failed "
                f"({e.code().name}: {e.details()}), retryable"
            ) from None
        wallet.settled(use, reply.node_seq)
        # Observed once created, as Schedule observes its placements.
        metrics.SCHEDULING_LATENCY.observe(decided)
        self.credit_creates += 1
        info: common_pb2.InstanceInfo = reply.instance
        info.node_id = info.node_id or use.node_id
        info.node_address = info.node_address or use.address
        return info

    def _node_lost(
        self, node_id: str, address: str, function: str, instance_id: str, lost: NodeLost
    ) -> None:
        """A create from a credit given up (its node declared dead or not
        answering): counted; the node's other credits are dropped (not used
        for this start or the next), and the start is stopped there in the
        background while Schedule places it elsewhere."""
        STARTS_RETRIED.labels(lost.reason).inc()
        log.warning(
            "start of %s on node %s given up (%s): placing it through Schedule",
            instance_id, node_id, lost.reason,
        )  # fmt: skip
        if self.credits is not None:
            self.credits.drop(lambda c: c.node_id != node_id)
        info = common_pb2.InstanceInfo(
            instance_id=instance_id, function=function, node_id=node_id, node_address=address
        )
        task = asyncio.create_task(self.delete_on_node(info))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def credit_upkeep(self) -> None:
        """Periodic: give back credits near expiry or of an idle instance
        (with the reports of what was made from them)."""
        if self.credits is not None:
            self._sync("", upkeep=True)
            self._credit_metrics(self.credits)

    def _credit_metrics(self, wallet: CreditWallet) -> None:
        metrics.DISPATCH_CREDITS_HELD.set(len(wallet.credits()))
        for event, n in wallet.stats.items():
            new = n - self._credit_stats.get(event, 0)
            if new > 0:
                metrics.DISPATCH_CREDIT_EVENTS.labels(event).inc(new)
        self._credit_stats = dict(wallet.stats)

    def grantor_owns(self, credit: Credit) -> bool:
        """True while the credit's grantor still owns its node (after a
        membership change the new owner knows nothing of it)."""
        view = self.view
        return view is not None and _owner_id(view, credit.node_id) == credit.grantor

    def refill(self) -> None:
        """Ask for credits at once (after some were dropped)."""
        if self.credits is not None:
            self._sync("", upkeep=False)

    def _sync(self, home: str, upkeep: bool) -> None:
        wallet = self.credits
        assert wallet is not None
        for g in wallet.due(home, upkeep=upkeep):
            req = wallet.begin_sync(g)
            task = asyncio.create_task(self._exchange(req))
            for group in (self._tasks, self._exchanges):
                group.add(task)
                task.add_done_callback(group.discard)

    async def return_credits(self, within_s: float) -> None:
        """Send back now what this instance's spent credits still hold (the
        remainders too small for a start, otherwise returned with the next
        periodic exchange) and wait until their grantors have them, at most
        ``within_s`` (``CreditWallet.room_retry`` decides when). A grantor
        with an exchange in flight gets its returns in the next one, sent
        as soon as that ends."""
        wallet = self.credits
        if wallet is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        wallet.return_all()
        while True:
            self._sync("", upkeep=True)
            left = deadline - loop.time()
            if not wallet.returns_outstanding() or left <= 0 or not self._exchanges:
                return
            await asyncio.wait(
                list(self._exchanges), timeout=left, return_when=asyncio.FIRST_COMPLETED
            )

    async def _exchange(self, req: SyncRequest) -> None:
        """One GrantCredits call (never awaited by a scale-up)."""
        wallet = self.credits
        assert wallet is not None
        grants: list[Grant] | None = None
        msg = schedule_pb2.GrantCreditsRequest(
            holder=self.instance_id,
            used=[
                schedule_pb2.CreditUse(
                    credit_id=u.credit_id, resources=u.need.to_proto(), node_seq=u.node_seq
                )
                for u in req.used
            ],
            returned=[
                schedule_pb2.CreditReturn(credit_id=cid, refused=refused)
                for cid, refused in req.returned
            ],
            want=req.want,
        )
        address = self._grantors.get(req.grantor, "")
        try:
            if not address:
                raise LookupError(f"schedule {req.grantor} is not in the membership")
            self.credit_exchanges += 1
            async with self.pool.stub(address, schedule_pb2_grpc.ScheduleStub) as s:
                reply = await s.GrantCredits(msg, timeout=CREDIT_TIMEOUT_S)
            grants = [
                Grant(c.credit_id, c.node_id, c.node_address, Res.from_proto(c.resources),
                      c.ttl_ms / 1000.0)
                for c in reply.credits
            ]  # fmt: skip
            for g in grants:
                self.agent_seen(g.node_id, g.address)
        except (grpc.aio.AioRpcError, LookupError) as e:
            # Its holds go with it (or expire): drop its credits.
            log.info("credits of schedule %s dropped: %s", req.grantor, e)
            if isinstance(e, grpc.aio.AioRpcError) and (
                e.code() == grpc.StatusCode.FAILED_PRECONDITION
            ):
                self._no_credits.add(req.grantor)  # credits off there: ask no more
                if wallet.home == req.grantor:
                    wallet.home = ""
        finally:
            wallet.end_sync(req, grants)

    async def close(self) -> None:
        """Cancel background calls (credit exchanges, reports) and the
        streams to node agents."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.creates.close()
        await self.agents.close()

    async def delete_on_node(self, info: common_pb2.InstanceInfo) -> bool:
        """Stop an instance on its node; True once its node agent answered.

        At most ``delete_concurrency`` calls are in flight, so each one's
        deadline runs from when it is sent, not while it waits behind
        thousands of others; a call that was not sent or not answered is
        tried again (``DELETE_ATTEMPTS``). An instance still not deleted is
        logged and counted (``galaxy_dispatch_deletes_failed_total``): the
        node agent's orphan check stops it later.
        """
        req = nodeagent_pb2.DeleteInstanceRequest(
            node_id=info.node_id, instance_id=info.instance_id
        )
        code, details = "NO_ADDRESS", "node address unknown"
        address = self.agent_address(info)
        for attempt in range(DELETE_ATTEMPTS if address else 0):
            if attempt:
                # A pause between attempts (a node agent under load), not a wait for an event.
                await asyncio.sleep(DELETE_BACKOFF_S * 2 ** (attempt - 1))
            async with self._deletes:
                try:
                    await self.agents.delete(address, req)
                    return True
                except grpc.aio.AioRpcError as e:
                    code, details = e.code().name, e.details() or ""
                    if e.code() not in DELETE_RETRY_ON:
                        break
        self.deletes_failed += 1
        DELETES_FAILED.labels(code).inc()
        log.warning(
            "could not delete instance %s of %s on node %s (%s: %s); the node agent's "
            "orphan check will stop it",
            info.instance_id, info.function, info.node_id, code, details,
        )  # fmt: skip
        return False

    async def forward_release(self, owner: common_pb2.ControlInstance, lease_id: str) -> None:
        """Pass a release that reached a stale owner on to the function's owner."""
        fwd = dispatch_pb2.ReleaseRequest(lease_id=lease_id, forwarded=True)
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                await s.Release(fwd, timeout=FORWARD_RELEASE_S)
        except grpc.aio.AioRpcError as e:
            log.warning("forwarding release %s failed: %s", lease_id, e.details())

    async def send_instance(
        self, owner: common_pb2.ControlInstance, info: common_pb2.InstanceInfo, leases: list[str]
    ) -> None:
        """Hand an instance (and its reserved slots) to the function's new owner."""
        req = dispatch_pb2.ModInstanceRequest(
            op=dispatch_pb2.ModInstanceRequest.OP_ADD,
            instance=info,
            reason=f"handed over by {self.instance_id}",
            active_leases=leases,
        )
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                await s.ModInstance(req)
        except grpc.aio.AioRpcError as e:
            # The instance keeps running; the new owner does not route to it
            # until it learns of it (e.g. on its next restart, from the records).
            log.warning("handover of %s to %s failed: %s", info.instance_id, owner.id, e.details())

    async def node_instances(self, node_id: str, address: str) -> set[str] | None:
        """The ids of the ready instances the agent at ``address`` runs on
        ``node_id``; None when it could not be asked."""
        if not address:
            return None
        try:
            async with self.pool.stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
                r = await s.ListNodeInstances(
                    nodeagent_pb2.ListNodeInstancesRequest(node_id=node_id), timeout=2.0
                )
            return {i.instance_id for i in r.instances}
        except grpc.aio.AioRpcError as e:
            log.warning("cannot verify instances on %s (%s): %s", node_id, address, e.details())
            return None

    async def running(
        self, records: list[common_pb2.InstanceInfo]
    ) -> tuple[list[common_pb2.InstanceInfo], list[common_pb2.InstanceInfo]]:
        """Split records into (still running, gone) by asking their node agents.

        A node that cannot be asked counts as gone for its instances: routing
        to an instance nobody can vouch for would fail requests.
        """
        by_node: dict[tuple[str, str], list[common_pb2.InstanceInfo]] = {}
        for info in records:
            by_node.setdefault((info.node_address, info.node_id), []).append(info)

        async def alive(addr: str, node: str) -> set[str]:
            return await self.node_instances(node, addr) or set()

        keys = list(by_node)
        found = await asyncio.gather(*(alive(a, n) for a, n in keys))
        live: list[common_pb2.InstanceInfo] = []
        gone: list[common_pb2.InstanceInfo] = []
        for key, ids in zip(keys, found, strict=True):
            for info in by_node[key]:
                (live if info.instance_id in ids else gone).append(info)
        return live, gone
