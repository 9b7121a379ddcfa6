"""Controller gRPC servicer: thin adapter over ControlRegistry, FunctionStore,
RuntimeStore, the Coordinator (membership pushes) and the Reconciler
(scaling).

With leader election, only the leader answers: a follower forwards every
call to the leader, so instances and clients may talk to any controller.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from controlplane.controller import nodes
from controlplane.controller.coordinator import COORDINATE_STUBS, Coordinator
from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.graphs_api import GraphsApi
from controlplane.controller.graphs_store import GraphStore
from controlplane.controller.leader import LeaderElector
from controlplane.controller.leaderonly import leader_only
from controlplane.controller.reconcile import Reconciler
from controlplane.controller.registry import ControlRegistry, State
from controlplane.controller.runtimes_api import RuntimesApi
from controlplane.controller.runtimes_store import RuntimeStore
from controlplane.controller.tokens_api import TokensApi
from controlplane.controller.tokens_store import TokenStore
from controlplane.runtime import access, authn, rpc, servingruntime, validation
from controlplane.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from controlplane.runtime.membership import KIND_NAMES
from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
)

log = logging.getLogger(__name__)

# Deadline for controller -> instance pushes and status fan-out.
PUSH_TIMEOUT_S = 2.0


class ControllerServicer(TokensApi, RuntimesApi, GraphsApi, controller_pb2_grpc.ControllerServicer):
    """Membership, load reports, the function admin API, tokens and status.

    coordinator: membership pushes (made from registry and pool if None).
    reconciler: scaling (status only shows load without one). elector:
    leader election (None: this controller always leads). runtimes: the
    serving runtimes (default: in the functions' state store); inference
    graphs are kept in the functions' state store too. tokens:
    where bearer tokens are kept (made on functions' store if None);
    authenticator: set when this controller checks tokens (its cache
    forgets a revoked token at once). Namespaces are checked against the
    caller that ``authn.current`` reports (everyone may act on every
    namespace when tokens are off).
    """

    def __init__(
        self,
        registry: ControlRegistry,
        functions: FunctionStore,
        pool: rpc.ChannelPool,
        *,
        coordinator: Coordinator | None = None,
        reconciler: Reconciler | None = None,
        elector: LeaderElector | None = None,
        controller_id: str = "controller",
        runtimes: RuntimeStore | None = None,
        tokens: TokenStore | None = None,
        authenticator: authn.Authenticator | None = None,
    ) -> None:
        self.registry = registry
        self.functions = functions
        self.runtimes = runtimes or RuntimeStore(functions.store)
        self.tokens = tokens or TokenStore(functions.store)
        self.graphs = GraphStore(functions.store)
        self.authenticator = authenticator
        self.coordinator = coordinator or Coordinator(registry, pool)
        self.reconciler = reconciler
        self.elector = elector
        self.controller_id = controller_id
        self.address = ""
        self._pool = pool
        # Instances being checked after an unreachable report (one check each).
        self._checking: set[tuple[int, str]] = set()
        if elector is not None:
            self.coordinator.active = lambda: elector.is_leader

    @property
    def pool(self) -> rpc.ChannelPool:
        """The channel pool used for every outgoing call."""
        return self._pool

    @pool.setter
    def pool(self, pool: rpc.ChannelPool) -> None:
        self._pool = pool
        self.coordinator.pool = pool

    def start(self) -> None:
        """Start the background membership pusher."""
        self.coordinator.start()

    async def stop(self) -> None:
        """Stop background work."""
        await self.coordinator.stop()

    # -- leadership -------------------------------------------------------

    async def _forwarded(self, method: str, request: Any, context: Any) -> Any | None:
        """The leader's answer when this controller is a follower, else None."""
        el = self.elector
        if el is None or el.is_leader:
            return None
        # Just started, or an election is running: it ends within a TTL.
        leader = el.leader or await el.wait_leader(el.ttl_s)
        if el.is_leader:
            return None
        if leader is None or leader.id == el.me.id:
            raise Unavailable("no controller leads right now (election in progress); retry")
        remaining = context.time_remaining() if context is not None else None
        try:
            async with self.pool.stub(leader.address, controller_pb2_grpc.ControllerStub) as s:
                # With the caller's token: the leader judges namespaces again.
                return await getattr(s, method)(
                    request,
                    timeout=remaining or PUSH_TIMEOUT_S * 5,
                    metadata=authn.forwarded_metadata(context) if context is not None else None,
                )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(
                    f"leader {leader.id} at {leader.address} unreachable ({e.details()}); retry"
                ) from None
            await context.abort(code, e.details() or "")
            raise  # unreachable: abort raises

    # -- membership -------------------------------------------------------

    @leader_only
    async def RegisterInstance(
        self, request: common_pb2.ControlInstance, context: grpc.aio.ServicerContext
    ) -> common_pb2.Membership:
        if request.kind not in COORDINATE_STUBS:
            raise InvalidArgument(
                f"kind: must be one of {', '.join(KIND_NAMES[k] for k in COORDINATE_STUBS)}"
            )
        if not request.id:
            raise InvalidArgument("id: required")
        if not request.address or ":" not in request.address:
            raise InvalidArgument(
                f"address: must be host:port, got {validation.short(request.address)}"
            )
        changed = self.registry.register(request)
        reply = self.registry.membership(request.kind)
        if changed:
            log.info(
                "registered %s %s at %s (epoch %d)",
                KIND_NAMES[request.kind],
                request.id,
                request.address,
                self.registry.epoch,
            )
            self.coordinator.registered(request, reply)
        return reply

    @leader_only
    async def DeregisterInstance(
        self, request: common_pb2.ControlInstance, context: grpc.aio.ServicerContext
    ) -> common_pb2.Membership:
        if self.registry.deregister(request.kind, request.id):
            log.info(
                "deregistered %s %s (epoch %d)",
                KIND_NAMES.get(request.kind, "?"),
                request.id,
                self.registry.epoch,
            )
            self.coordinator.mark_dirty()
        return self.registry.membership(request.kind)

    @leader_only
    async def ReportUnreachable(
        self, request: common_pb2.ControlInstance, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ReportUnreachableReply:
        m = self.registry.get(request.kind, request.id)
        key = (request.kind, request.id)
        if m is None or m.info.address != request.address or key in self._checking:
            return controller_pb2.ReportUnreachableReply(removed=False)
        self._checking.add(key)
        try:
            # The report is a hint, not a verdict: only a failed check removes.
            if await rpc.serving(self._pool, request.address):
                return controller_pb2.ReportUnreachableReply(removed=False)
        finally:
            self._checking.discard(key)
        cur = self.registry.get(request.kind, request.id)
        if cur is None or cur.info.address != request.address:
            return controller_pb2.ReportUnreachableReply(removed=False)  # came back meanwhile
        log.warning(
            "%s %s reported unreachable and failed a health check: removed",
            KIND_NAMES.get(request.kind, "?"), request.id,
        )  # fmt: skip
        if self.registry.deregister(request.kind, request.id):
            self.coordinator.mark_dirty()
        return controller_pb2.ReportUnreachableReply(removed=True)

    @leader_only
    async def ReportLoad(
        self, request: controller_pb2.LoadReport, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ReportLoadReply:
        known = self.registry.report(
            request.instance.kind,
            request.instance.id,
            dict(request.ops_per_second),
            request.queue_depth,
            request.errors,
        )
        m = self.registry.get(request.instance.kind, request.instance.id)
        return controller_pb2.ReportLoadReply(
            membership_stale=not known,
            epoch=self.registry.epoch,
            standby=m is not None and m.state is State.STANDBY,
        )

    @leader_only
    async def GetMembership(
        self, request: controller_pb2.GetMembershipRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Membership:
        return self.registry.membership()

    async def _coordinate(
        self, inst: common_pb2.ControlInstance, req: common_pb2.CoordinateRequest
    ) -> bool:
        return await self.coordinator.coordinate(inst, req)

    # -- functions --------------------------------------------------------

    @leader_only
    async def DeployFunction(
        self, request: controller_pb2.DeployFunctionRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FunctionSpec:
        if not request.HasField("function"):
            raise InvalidArgument("function: required")
        # The CLI checked the same rules; the server is the guard.
        spec = request.function
        servingruntime.check_request(spec)
        await self._check_namespace(spec)
        # The registered nodes: a spec must fit one; the default quota is a share.
        known = await nodes.capacities(
            self.pool, (m.info for m in self.registry.members(common_pb2.CONTROL_KIND_CLUSTERMGR))
        )
        # The runtime cannot be deleted between its check and the write.
        async with self.runtimes.lock:
            resolved = await self._resolve(spec)
            stored = await self.functions.deploy(resolved, known)
        log.info(
            "deployed function %s (revision %d, version %d)",
            stored.name,
            stored.revision,
            stored.version,
        )
        await self._notify_dispatch(common_pb2.CoordinateAction.KIND_FUNCTION_UPDATED, stored.name)
        return stored

    @leader_only
    async def GetFunction(
        self, request: controller_pb2.GetFunctionRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FunctionSpec:
        validation.check_name("name", request.name)
        return await self._visible(request.name)

    async def _visible(self, name: str) -> common_pb2.FunctionSpec:
        """The spec of name, if the caller may act on its namespace."""
        spec = await self.functions.get(name)
        authn.ensure_namespace(spec.namespace, f"function {name}")
        return spec

    @leader_only
    async def ListFunctions(
        self, request: controller_pb2.ListFunctionsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListFunctionsReply:
        who = authn.current()
        fns = [f for f in await self.functions.list() if who.sees(f.namespace)]
        return controller_pb2.ListFunctionsReply(functions=fns)

    @leader_only
    async def DeleteFunction(
        self, request: controller_pb2.DeleteFunctionRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteFunctionReply:
        validation.check_name("name", request.name)
        await self._visible(request.name)
        await self.functions.delete(request.name)
        log.info("deleted function %s", request.name)
        await self._notify_dispatch(common_pb2.CoordinateAction.KIND_FUNCTION_DELETED, request.name)
        return controller_pb2.DeleteFunctionReply()

    @leader_only
    async def ListRevisions(
        self, request: controller_pb2.ListRevisionsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListRevisionsReply:
        validation.check_name("name", request.name)
        spec = await self._visible(request.name)
        revs = await self.functions.list_revisions(request.name)
        return controller_pb2.ListRevisionsReply(revisions=revs, traffic=spec.traffic)

    @leader_only
    async def SetTraffic(
        self, request: controller_pb2.SetTrafficRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FunctionSpec:
        validation.check_name("name", request.name)
        await self._visible(request.name)
        stored = await self.functions.set_traffic(request.name, list(request.traffic))
        split = ", ".join(f"{t.revision or 'latest'}={t.percent}" for t in stored.traffic)
        log.info("traffic of function %s: %s", stored.name, split)
        await self._notify_dispatch(common_pb2.CoordinateAction.KIND_FUNCTION_UPDATED, stored.name)
        return stored

    async def _check_namespace(self, spec: common_pb2.FunctionSpec) -> None:
        """Give spec its namespace (the caller's by default) and refuse one
        the caller may not act on, or a change of an existing function's."""
        spec.namespace = spec.namespace or authn.current().namespace or access.DEFAULT_NAMESPACE
        what = f"function {spec.name}"
        authn.ensure_namespace(spec.namespace, what)
        try:
            current = await self.functions.get(spec.name)
        except NotFound:
            return
        authn.ensure_namespace(current.namespace, what)
        if (current.namespace or access.DEFAULT_NAMESPACE) != spec.namespace:
            raise FailedPrecondition(
                f"namespace: {what} is in namespace "
                f"{current.namespace or access.DEFAULT_NAMESPACE}; a function's namespace "
                "cannot change (delete it, then deploy it again)"
            )

    async def _resolve(self, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
        """The spec with its runtime's command (servingruntime.resolve;
        check_request has passed)."""
        rt = await self.runtimes.find(spec.runtime)
        if rt is None:
            raise InvalidArgument(
                f"runtime: no runtime {validation.short(spec.runtime)} is registered "
                "(see `galaxy runtimes list`)"
            )
        return servingruntime.resolve(spec, rt)

    async def _notify_dispatch(self, kind: int, name: str) -> None:
        req = common_pb2.CoordinateRequest(
            actions=[common_pb2.CoordinateAction(kind=kind, function=name)]  # type: ignore[arg-type]
        )
        await asyncio.gather(
            *(
                self._coordinate(m.info, req)
                for m in self.registry.members(common_pb2.CONTROL_KIND_DISPATCH)
            )
        )

    # -- status -----------------------------------------------------------

    def info(self) -> controller_pb2.ControllerInfo:
        """Who this controller is and who leads."""
        el = self.elector
        leader = el.leader if el is not None else None
        rc = self.reconciler
        return controller_pb2.ControllerInfo(
            id=self.controller_id,
            address=self.address,
            leader=el is None or el.is_leader,
            leader_id=leader.id if leader else (self.controller_id if el is None else ""),
            leader_address=leader.address if leader else (self.address if el is None else ""),
            term=leader.term if leader else 0,
            autoscale=rc is not None and rc.enabled,
            actuator=rc.actuator.name if rc is not None else "none",
        )

    @leader_only
    async def GetClusterStatus(
        self, request: controller_pb2.GetClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ClusterStatus:
        out = controller_pb2.ClusterStatus(membership=self.registry.membership())
        out.controller.CopyFrom(self.info())
        if self.reconciler is not None:
            out.scaling.extend(self.reconciler.status())
        out.functions.extend(await self.functions.list())

        async def known(inst: common_pb2.ControlInstance) -> None:
            out.nodes.extend(await nodes.cluster_nodes(self.pool, inst, PUSH_TIMEOUT_S))

        async def instances(inst: common_pb2.ControlInstance) -> None:
            async with self.pool.stub(inst.address, dispatch_pb2_grpc.DispatchStub) as s:
                r = await s.ListInstances(
                    dispatch_pb2.ListInstancesRequest(), timeout=PUSH_TIMEOUT_S
                )
            out.instances.extend(r.instances)
            out.routing.extend(r.functions)

        calls = [
            (m.info, known(m.info))
            for m in self.registry.members(common_pb2.CONTROL_KIND_CLUSTERMGR)
        ]
        calls += [
            (m.info, instances(m.info))
            for m in self.registry.members(common_pb2.CONTROL_KIND_DISPATCH)
        ]
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (inst, _), res in zip(calls, results, strict=True):
            if isinstance(res, grpc.aio.AioRpcError):
                out.warnings.append(
                    f"{KIND_NAMES[inst.kind]} {inst.id}: {res.code().name} {res.details()}"
                )
            elif isinstance(res, BaseException):
                out.warnings.append(f"{KIND_NAMES[inst.kind]} {inst.id}: {res!r}")
        out.nodes.sort(key=lambda n: _natural(n.status.node_id))
        return out


def _natural(name: str) -> tuple[str, int, str]:
    """Sort key so node-2 comes before node-10."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail), "") if tail.isdigit() else (name, -1, name)
