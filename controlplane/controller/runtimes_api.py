"""The controller's serving-runtime RPCs (PutRuntime, GetRuntime,
ListRuntimes, DeleteRuntime), mixed into ControllerServicer. Who may call
them is decided before they run (``access.decide``: admins write,
developers read)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from controlplane.controller.leaderonly import leader_only
from controlplane.runtime import validation
from controlplane.runtime.errors import FailedPrecondition, InvalidArgument
from galaxy.v1 import common_pb2, controller_pb2

if TYPE_CHECKING:
    from controlplane.controller.functions_store import FunctionStore
    from controlplane.controller.runtimes_store import RuntimeStore

log = logging.getLogger(__name__)


class RuntimesApi:
    """Runtime administration; needs ``runtimes`` and ``functions`` (a
    runtime in use cannot be deleted)."""

    runtimes: RuntimeStore
    functions: FunctionStore

    @leader_only
    async def PutRuntime(
        self, request: controller_pb2.PutRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ServingRuntime:
        if not request.HasField("runtime"):
            raise InvalidArgument("runtime: required")
        stored = await self.runtimes.put(request.runtime)
        log.info("runtime %s stored (version %d)", stored.name, stored.version)
        return stored

    @leader_only
    async def GetRuntime(
        self, request: controller_pb2.GetRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ServingRuntime:
        validation.check_name("name", request.name)
        return await self.runtimes.get(request.name)

    @leader_only
    async def ListRuntimes(
        self, request: controller_pb2.ListRuntimesRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListRuntimesReply:
        return controller_pb2.ListRuntimesReply(runtimes=await self.runtimes.list())

    @leader_only
    async def DeleteRuntime(
        self, request: controller_pb2.DeleteRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteRuntimeReply:
        validation.check_name("name", request.name)
        async with self.runtimes.lock:
            await self.runtimes.get(request.name)  # NOT_FOUND before "in use"
            users = [f.name for f in await self.functions.list() if f.runtime == request.name]
            if users:
                more = f" and {len(users) - 1} more" if len(users) > 1 else ""
                raise FailedPrecondition(
                    f"name: runtime {request.name} is used by function {users[0]}{more}; "
                    "delete those functions or deploy them with another runtime first"
                )
            await self.runtimes.delete(request.name)
        log.info("deleted runtime %s", request.name)
        return controller_pb2.DeleteRuntimeReply()
