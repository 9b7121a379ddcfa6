"""Schedule gRPC servicer: a thin adapter around ``PlacementPolicy``.

It validates requests, makes ``Schedule`` idempotent for instance_id, and
performs the I/O the policy asks for: Probe RPCs to node agents (concurrently)
and the CreateInstance that completes a placement.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Iterable

import grpc
from prometheus_client import Counter

from controlplane.runtime import models, rpc
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.metrics import (
    NODES,
    PROBE_ROUND_TRIP,
    PROBES,
    SCHEDULE_PENDING,
    SCHEDULE_REJECTED,
    SCHEDULING_LATENCY,
)
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import MODELS_PER_NODE, Placing
from controlplane.runtime.watched_creates import NodeLost, WatchedCreates
from functions.schedule.credits import CreditLedger, Use
from functions.schedule.model import ZERO, NodeInfo, NoFit, Placement, ProbeNodes, Target
from functions.schedule.policy import PlacementPolicy
from galaxy.v1 import (
    common_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAME = schedule_pb2.DESCRIPTOR.services_by_name["Schedule"].full_name
SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
UPSERT = schedule_pb2.ModNodeRequest.OP_UPSERT
REMOVE = schedule_pb2.ModNodeRequest.OP_REMOVE

# CreateInstance answers when the instance is ready, so its deadline covers
# the function's startup timeout plus this margin (or the default when the
# function sets none).
_CREATE_MARGIN_S = 5.0
_DEFAULT_CREATE_TIMEOUT_S = 60.0
# Agent answers that mean "not created here, try another node".
_RETRY_ELSEWHERE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND)
STARTS_RETRIED = Counter(
    "galaxy_schedule_starts_retried_total",
    "Starts placed on another node because their node was declared dead "
    "(node_dead) or its agent did not answer a probe (no_answer) while the "
    "create waited",
    ["reason"],
)


def node_info(s: common_pb2.NodeStatus) -> NodeInfo:
    """NodeStatus (wire) -> NodeInfo (policy)."""
    return NodeInfo(
        s.node_id,
        s.address,
        Res.from_proto(s.capacity),
        Res.from_proto(s.allocated),
        s.seq,
        s.instances,
        Res.from_proto(s.starting) if s.HasField("starting") else ZERO,
        held_models(s.models),
    )


def held_models(held: Iterable[common_pb2.ModelHeld]) -> dict[str, tuple[str, int]] | None:
    """NodeStatus.models -> NodeInfo.models (the first, most recently used,
    of a digest wins; at most ``MODELS_PER_NODE`` are read whatever was sent)."""
    out: dict[str, tuple[str, int]] = {}
    for m in itertools.islice(held, MODELS_PER_NODE):
        out.setdefault(m.digest, (m.tier, m.size_bytes))
    return out or None


def placing(fn: common_pb2.FunctionSpec, policy: PlacementPolicy) -> str | Placing:
    """What the scoring term sees of a function: its name, and its model's
    cache key and size (from the spec, else from a node that holds it)."""
    if not fn.HasField("model"):
        return fn.name
    digest = models.digest(fn.model)
    return Placing(fn.name, digest, fn.model.size_bytes or policy.holders.size(digest))


def node_status(n: NodeInfo) -> common_pb2.NodeStatus:
    """NodeInfo (policy) -> NodeStatus (wire)."""
    return common_pb2.NodeStatus(
        node_id=n.node_id,
        address=n.address,
        capacity=n.capacity.to_proto(),
        allocated=n.allocated.to_proto(),
        instances=n.instances,
        seq=n.seq,
        starting=n.starting.to_proto(),
        models=[
            common_pb2.ModelHeld(digest=d, tier=tier, size_bytes=size)
            for d, (tier, size) in (n.models or {}).items()
        ],
    )


def _rpc_error(e: grpc.aio.AioRpcError) -> str:
    return f"{e.code().name}: {e.details()}"


class ScheduleServicer(schedule_pb2_grpc.ScheduleServicer):
    """The Schedule API of one instance.

    ``bind(schedule_id, pool)`` must be called before serving when the id and
    pool are only known once the server is up (see ``functions.schedule.main``).
    recent_results: how many successful replies are kept for idempotent
    retries. probe_timeout_s: deadline of one Probe RPC. max_pending:
    placements in progress at once; a new one beyond is refused with
    RESOURCE_EXHAUSTED (Dispatch then spills to the next Schedule instance).
    """

    def __init__(
        self,
        policy: PlacementPolicy,
        *,
        schedule_id: str = "",
        pool: rpc.ChannelPool | None = None,
        clock: Clock | None = None,
        recent_results: int = 4096,
        probe_timeout_s: float = 2.0,
        credits: CreditLedger | None = None,
        max_pending: int = 10_000,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.max_pending = max_pending
        self.policy = policy
        #: capacity credits lent to Dispatch instances (None: off)
        self.credits = credits
        self.pool = pool or rpc.ChannelPool()
        self.clock = clock or MonotonicClock()
        self.membership = MembershipView()
        self.probe_timeout_s = probe_timeout_s
        self._recent: OrderedDict[str, schedule_pb2.ScheduleReply] = OrderedDict()
        self._recent_max = recent_results
        self._running: dict[str, asyncio.Task[schedule_pb2.ScheduleReply]] = {}
        # Deletes of starts given up on a lost node, in flight.
        self._undos: set[asyncio.Task[None]] = set()
        #: Schedule requests received (the SRPS the load reporter sends).
        self.arrivals = 0
        #: CreateInstance/DeleteInstance, on a stream per node agent
        self.agents = AgentCalls(lambda: self.pool)
        #: the creates in flight, given up when their node is lost
        self.creates = WatchedCreates(self.agents, lambda: self.pool)
        self.bind(schedule_id or policy.schedule_id, self.pool)

    def bind(self, schedule_id: str, pool: rpc.ChannelPool) -> None:
        """Set this instance's id (also the policy's) and its channel pool."""
        self.schedule_id = schedule_id
        self.policy.schedule_id = schedule_id
        self.pool = pool

    async def close(self) -> None:
        """Cancel placements still running (shutdown); their holds are released."""
        tasks = [*self._running.values(), *self._undos]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.creates.close()
        await self.agents.close()

    # ----- API ---------------------------------------------------------------

    @property
    def running(self) -> int:
        """Placements in progress (probing, creating the instance)."""
        return len(self._running)

    async def Schedule(
        self, request: schedule_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ScheduleReply:
        self.arrivals += 1
        self._validate(request)
        iid = request.instance_id
        done = self._recent.get(iid)
        if done is None and (task := self._running.get(iid)) is not None and task.done():
            # Finished, but its done-callback has not run yet: read it directly.
            done = None if task.cancelled() or task.exception() else task.result()
        if done is not None:
            if done.instance.function != request.function.name:
                raise InvalidArgument(
                    f"instance_id {iid} was already used for function {done.instance.function}"
                )
            return done
        task = self._running.get(iid)
        if task is None:
            if len(self._running) >= self.max_pending:  # a retry above joins, never shed
                SCHEDULE_REJECTED.labels("queue_full").inc()
                raise ResourceExhausted(
                    f"schedule {self.schedule_id} has {len(self._running)} placements in "
                    f"progress (max_pending {self.max_pending}); try another instance"
                )
            # The placement runs as its own task: a caller that gives up
            # (deadline, cancel) must not abandon a half-made instance, and a
            # retry with the same id joins or reads the outcome.
            task = asyncio.create_task(self._place(request))
            self._running[iid] = task
            SCHEDULE_PENDING.inc()
            task.add_done_callback(lambda t: self._finished(iid, t))
        return await asyncio.shield(task)

    async def ModNode(
        self, request: schedule_pb2.ModNodeRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ModNodeReply:
        self._check_mod(request, "")
        changed = self._apply_mod(request)
        NODES.labels("schedule_partition").set(len(self.policy))
        return schedule_pb2.ModNodeReply(changed=changed)

    async def ModNodes(
        self, request: schedule_pb2.ModNodesRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ModNodesReply:
        # Validate all first: a bad batch changes nothing.
        for i, change in enumerate(request.changes):
            self._check_mod(change, f"changes[{i}].")
        out = schedule_pb2.ModNodesReply(changed=[self._apply_mod(c) for c in request.changes])
        NODES.labels("schedule_partition").set(len(self.policy))
        return out

    @staticmethod
    def _check_mod(request: schedule_pb2.ModNodeRequest, where: str) -> None:
        node = request.node
        if not node.node_id:
            raise InvalidArgument(f"{where}node.node_id must be set")
        if request.op == UPSERT and not node.address:
            raise InvalidArgument(f"{where}node.address must be set (the node agent's host:port)")
        if request.op not in (UPSERT, REMOVE):
            raise InvalidArgument(f"{where}op must be OP_UPSERT or OP_REMOVE, got {request.op}")

    def _apply_mod(self, request: schedule_pb2.ModNodeRequest) -> bool:
        node = request.node
        if request.op == REMOVE:
            # Declared dead (or a new incarnation replaces it): starts
            # waiting on it go to other nodes now, not at their deadline.
            self.creates.node_dead(node.node_id)
            gone = self.policy.remove(node.node_id)
            if gone and self.credits is not None:
                self.credits.retain()  # a dead node's credits die with it
            return gone
        # ClusterMgr may route with a membership older or newer than ours;
        # holding a node we do not own would let two instances place on it.
        return self._owns(node.node_id) and self.policy.upsert(node_info(node))

    async def Coordinate(
        self, request: common_pb2.CoordinateRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CoordinateReply:
        if request.HasField("membership"):
            self.apply_membership(request.membership)
        return common_pb2.CoordinateReply(epoch=self.membership.epoch)

    async def ListNodes(
        self, request: schedule_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ListNodesReply:
        return schedule_pb2.ListNodesReply(
            schedule_id=self.schedule_id, nodes=[node_status(n) for n in self.policy.nodes()]
        )

    async def GrantCredits(
        self, request: schedule_pb2.GrantCreditsRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.GrantCreditsReply:
        if self.credits is None:
            raise FailedPrecondition(
                f"schedule {self.schedule_id} grants no capacity credits "
                "(started with --no-credits)"
            )
        if not request.holder:
            raise InvalidArgument("holder must be set (the Dispatch instance's id)")
        for i, u in enumerate(request.used):
            if not u.credit_id:
                raise InvalidArgument(f"used[{i}].credit_id must be set")
        for i, r in enumerate(request.returned):
            if not r.credit_id:
                raise InvalidArgument(f"returned[{i}].credit_id must be set")
        used = [Use(u.credit_id, Res.from_proto(u.resources), u.node_seq) for u in request.used]
        returned = [(r.credit_id, r.refused) for r in request.returned]
        grants = self.credits.sync(request.holder, used, returned, request.want)
        return schedule_pb2.GrantCreditsReply(
            schedule_id=self.schedule_id,
            credits=[
                schedule_pb2.Credit(
                    credit_id=g.credit_id,
                    node_id=g.node_id,
                    node_address=g.address,
                    resources=g.resources.to_proto(),
                    ttl_ms=int(g.ttl_s * 1000),
                )
                for g in grants
            ],
        )

    # ----- membership --------------------------------------------------------

    def apply_membership(self, m: common_pb2.Membership) -> list[str]:
        """Adopt a newer membership and drop the nodes no longer in this
        instance's partition; returns them."""
        if not self.membership.update(m):
            return []
        dropped = self.policy.retain(self._owns)
        if self.credits is not None:
            # Credits on nodes that moved away, and of Dispatch instances
            # that left: their holds go.
            self.credits.retain()
            holders = {i.id for i in self.membership.instances(DISPATCH)}
            for h in (self.credits.holders() - holders) if holders else set():
                self.credits.drop_holder(h)
        if dropped:
            log.info("schedule %s: %d nodes left the partition", self.schedule_id, len(dropped))
        NODES.labels("schedule_partition").set(len(self.policy))
        return dropped

    def _owns(self, node_id: str) -> bool:
        owner = self.membership.owner(SCHEDULE, node_id)
        # No Schedule member known yet (standalone, or before registration):
        # nothing says the node is someone else's.
        return owner is None or owner.id == self.schedule_id

    # ----- placement ---------------------------------------------------------

    def _validate(self, request: schedule_pb2.ScheduleRequest) -> None:
        if not request.instance_id:
            raise InvalidArgument("instance_id must be set")
        if not request.HasField("function"):
            raise InvalidArgument("function must be set")
        if not request.function.name:
            raise InvalidArgument("function.name must be set")
        if not request.function.HasField("resources"):
            raise InvalidArgument("function.resources must be set")

    def _finished(self, iid: str, task: asyncio.Task[schedule_pb2.ScheduleReply]) -> None:
        if self._running.pop(iid, None) is not None:
            SCHEDULE_PENDING.dec()
        if task.cancelled() or task.exception() is not None:
            return  # an error is not remembered: a retry places again
        self._recent[iid] = task.result()
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)

    async def _place(self, request: schedule_pb2.ScheduleRequest) -> schedule_pb2.ScheduleReply:
        t0 = self.clock.now()
        need = Res.from_proto(request.function.resources)
        pl = self.policy.begin(need, placing(request.function, self.policy))
        try:
            while True:
                step = self.policy.advance(pl)
                if isinstance(step, NoFit):
                    if step.permanent:  # README: cannot fit on any node
                        raise FailedPrecondition(step.reason)
                    raise ResourceExhausted(step.reason)
                if isinstance(step, ProbeNodes):
                    await self._probe(pl, step)
                    continue
                decided = self.clock.now() - t0
                try:
                    reply = await self._create(step.node_id, step.address, request)
                except NodeLost as lost:
                    self._node_lost(step.node_id, step.address, request.instance_id, lost)
                    self.policy.reject(step)  # another node, the lost one excluded
                    continue
                except grpc.aio.AioRpcError as e:
                    if e.code() in _RETRY_ELSEWHERE:
                        log.info("node %s refused %s: %s", step.node_id, request.instance_id, e)
                        self.policy.reject(step)
                        continue
                    self.policy.abort(step)
                    if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        raise InvalidArgument(
                            f"node agent refused the function: {e.details()}"
                        ) from None
                    # The agent may go on with a start its caller gave up on:
                    # stop it, so that Dispatch's retry or spill (the same
                    # id, maybe another node) is the only instance.
                    await self._undo_create(step.node_id, step.address, request.instance_id)
                    raise Unavailable(
                        f"creating instance {request.instance_id} on node {step.node_id} "
                        f"failed ({_rpc_error(e)}), retryable"
                    ) from None
                self.policy.confirm(step, reply.node_seq)
                SCHEDULING_LATENCY.observe(decided)
                instance = reply.instance
                # Dispatch deletes the instance through node_address later.
                instance.node_id = instance.node_id or step.node_id
                instance.node_address = instance.node_address or step.address
                return schedule_pb2.ScheduleReply(
                    instance=instance,
                    schedule_id=self.schedule_id,
                    probes=pl.probes,
                    scheduling_ms=decided * 1000.0,
                )
        finally:
            self.policy.cancel(pl)  # no-op after a confirm; releases any hold otherwise

    async def _probe(self, pl: Placement, step: ProbeNodes) -> None:
        PROBES.inc(len(step.targets))
        t0 = self.clock.now()
        answers = await asyncio.gather(*(self._probe_one(t) for t in step.targets))
        PROBE_ROUND_TRIP.observe(self.clock.now() - t0)
        for t, status in zip(step.targets, answers, strict=True):
            self.policy.record_probe(pl, t.node_id, status)

    async def _probe_one(self, t: Target) -> NodeInfo | None:
        try:
            async with self.pool.stub(t.address, nodeagent_pb2_grpc.NodeAgentStub) as stub:
                reply = await stub.Probe(
                    nodeagent_pb2.ProbeRequest(node_id=t.node_id), timeout=self.probe_timeout_s
                )
        except grpc.aio.AioRpcError as e:
            log.info("probe of node %s at %s failed: %s", t.node_id, t.address, _rpc_error(e))
            return None
        except Exception as e:  # e.g. an unusable address: one bad node must not fail all
            log.warning("probe of node %s at %s failed: %r", t.node_id, t.address, e)
            return None
        return node_info(reply.status)

    def _node_lost(self, node_id: str, address: str, instance_id: str, lost: NodeLost) -> None:
        """A create given up (its node declared dead or not answering): counted,
        and stopped there in the background (a stopped agent would hold the
        placement until the delete's deadline; its orphan check is the
        backstop), while the placement goes on elsewhere."""
        STARTS_RETRIED.labels(lost.reason).inc()
        log.warning(
            "start of %s on node %s given up (%s): placing it on another node",
            instance_id, node_id, lost.reason,
        )  # fmt: skip
        task = asyncio.create_task(self._undo_create(node_id, address, instance_id))
        self._undos.add(task)
        task.add_done_callback(self._undos.discard)

    async def _undo_create(self, node_id: str, address: str, instance_id: str) -> None:
        """Stop a start that may be under way on a node (best effort, logged)."""
        try:
            req = nodeagent_pb2.DeleteInstanceRequest(node_id=node_id, instance_id=instance_id)
            await self.agents.delete(address, req)
        except grpc.aio.AioRpcError as e:
            log.warning(
                "could not stop the start of %s on node %s: %s", instance_id, node_id, _rpc_error(e)
            )

    async def _create(
        self, node_id: str, address: str, request: schedule_pb2.ScheduleRequest
    ) -> nodeagent_pb2.CreateInstanceReply:
        startup_ms = request.function.startup_timeout_ms
        timeout = startup_ms / 1000 + _CREATE_MARGIN_S if startup_ms else _DEFAULT_CREATE_TIMEOUT_S
        req = nodeagent_pb2.CreateInstanceRequest(
            node_id=node_id,
            instance_id=request.instance_id,
            function=request.function,
            notify_address=request.notify_address,
        )
        return await self.creates.create(node_id, address, req, timeout)
