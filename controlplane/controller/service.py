"""Controller gRPC servicer: thin adapter over ControlRegistry and FunctionStore."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from controlplane import rpc
from controlplane.controller.functions_store import FunctionStore
from controlplane.controller.registry import ControlRegistry
from controlplane.errors import InvalidArgument
from controlplane.membership import KIND_NAMES
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
    schedule_pb2_grpc,
)

log = logging.getLogger(__name__)

_COORDINATE_STUBS: dict[int, Any] = {
    common_pb2.CONTROL_KIND_DISPATCH: dispatch_pb2_grpc.DispatchStub,
    common_pb2.CONTROL_KIND_SCHEDULE: schedule_pb2_grpc.ScheduleStub,
    common_pb2.CONTROL_KIND_CLUSTERMGR: clustermgr_pb2_grpc.ClusterMgrStub,
}
# Deadline for controller -> instance pushes and status fan-out.
PUSH_TIMEOUT_S = 2.0


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    """Membership, load reports and the function admin API."""

    def __init__(
        self, registry: ControlRegistry, functions: FunctionStore, pool: rpc.ChannelPool
    ) -> None:
        self.registry = registry
        self.functions = functions
        self.pool = pool
        self._dirty = asyncio.Event()
        self._pusher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the background membership pusher."""
        self._pusher = asyncio.create_task(self._push_loop(), name="membership-pusher")

    async def stop(self) -> None:
        """Stop background work."""
        if self._pusher:
            self._pusher.cancel()
            await asyncio.gather(self._pusher, return_exceptions=True)

    # -- membership -------------------------------------------------------

    async def RegisterInstance(
        self, request: common_pb2.ControlInstance, context: grpc.aio.ServicerContext
    ) -> common_pb2.Membership:
        if request.kind not in _COORDINATE_STUBS:
            raise InvalidArgument(
                f"kind: must be one of {', '.join(KIND_NAMES[k] for k in _COORDINATE_STUBS)}"
            )
        if not request.id:
            raise InvalidArgument("id: required")
        if not request.address or ":" not in request.address:
            raise InvalidArgument(f"address: must be host:port, got {request.address!r}")
        if self.registry.register(request):
            log.info(
                "registered %s %s at %s (epoch %d)",
                KIND_NAMES[request.kind],
                request.id,
                request.address,
                self.registry.epoch,
            )
            self._dirty.set()
        return self.registry.membership()

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
            self._dirty.set()
        return self.registry.membership()

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
        return controller_pb2.ReportLoadReply(membership_stale=not known, epoch=self.registry.epoch)

    async def GetMembership(
        self, request: controller_pb2.GetMembershipRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Membership:
        return self.registry.membership()

    async def _push_loop(self) -> None:
        # One pusher, always sending the latest membership: a burst of
        # registrations coalesces into few pushes and none goes out of order.
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            m = self.registry.membership()
            await asyncio.gather(
                *(
                    self._coordinate(mem.info, common_pb2.CoordinateRequest(membership=m))
                    for mem in self.registry.members()
                )
            )

    async def _coordinate(
        self, inst: common_pb2.ControlInstance, req: common_pb2.CoordinateRequest
    ) -> bool:
        stub_cls = _COORDINATE_STUBS.get(inst.kind)
        if stub_cls is None:
            return False
        try:
            async with self.pool.stub(inst.address, stub_cls) as stub:
                await stub.Coordinate(req, timeout=PUSH_TIMEOUT_S)
            return True
        except grpc.aio.AioRpcError as e:
            log.warning(
                "Coordinate to %s %s failed: %s", KIND_NAMES[inst.kind], inst.id, e.details()
            )
            return False

    # -- functions --------------------------------------------------------

    async def DeployFunction(
        self, request: controller_pb2.DeployFunctionRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FunctionSpec:
        if not request.HasField("function"):
            raise InvalidArgument("function: required")
        stored = await self.functions.deploy(request.function)
        log.info("deployed function %s (version %d)", stored.name, stored.version)
        await self._notify_dispatch(common_pb2.CoordinateAction.KIND_FUNCTION_UPDATED, stored.name)
        return stored

    async def GetFunction(
        self, request: controller_pb2.GetFunctionRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FunctionSpec:
        if not request.name:
            raise InvalidArgument("name: required")
        return await self.functions.get(request.name)

    async def ListFunctions(
        self, request: controller_pb2.ListFunctionsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListFunctionsReply:
        return controller_pb2.ListFunctionsReply(functions=await self.functions.list())

    async def DeleteFunction(
        self, request: controller_pb2.DeleteFunctionRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteFunctionReply:
        if not request.name:
            raise InvalidArgument("name: required")
        await self.functions.delete(request.name)
        log.info("deleted function %s", request.name)
        await self._notify_dispatch(common_pb2.CoordinateAction.KIND_FUNCTION_DELETED, request.name)
        return controller_pb2.DeleteFunctionReply()

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

    async def GetClusterStatus(
        self, request: controller_pb2.GetClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ClusterStatus:
        out = controller_pb2.ClusterStatus(membership=self.registry.membership())
        out.functions.extend(await self.functions.list())

        async def nodes(inst: common_pb2.ControlInstance) -> None:
            async with self.pool.stub(inst.address, clustermgr_pb2_grpc.ClusterMgrStub) as s:
                r = await s.ListNodes(
                    clustermgr_pb2.ListClusterNodesRequest(), timeout=PUSH_TIMEOUT_S
                )
            out.nodes.extend(r.nodes)

        async def instances(inst: common_pb2.ControlInstance) -> None:
            async with self.pool.stub(inst.address, dispatch_pb2_grpc.DispatchStub) as s:
                r = await s.ListInstances(
                    dispatch_pb2.ListInstancesRequest(), timeout=PUSH_TIMEOUT_S
                )
            out.instances.extend(r.instances)
            out.routing.extend(r.functions)

        calls = [
            (m.info, nodes(m.info))
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
