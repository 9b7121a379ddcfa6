"""Function specs on a Dispatch instance: fetched from the controller on a
function's first request and kept until the controller says it changed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from controlplane.runtime import controllers, rpc, validation
from controlplane.runtime.errors import NotFound, Unavailable
from galaxy.v1 import common_pb2, controller_pb2


class SpecCache:
    """name -> FunctionSpec (functions and revisions), one fetch at a time.

    pool: returns the channel pool to use (the host replaces it on start).
    """

    def __init__(self, controller: str, pool: Callable[[], rpc.ChannelPool]) -> None:
        self.controller = controller
        self._pool = pool
        self.specs: dict[str, common_pb2.FunctionSpec] = {}
        self._fetches: dict[str, asyncio.Future[common_pb2.FunctionSpec]] = {}

    async def get(self, name: str) -> common_pb2.FunctionSpec:
        """The spec of name (cached), or NotFound / Unavailable."""
        spec = self.specs.get(name)
        if spec is not None:
            return spec
        # Concurrent first requests share one fetch from the controller.
        fut = self._fetches.get(name)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._fetches[name] = fut
            try:
                spec = await controllers.call(
                    self._pool(),
                    self.controller,
                    "GetFunction",
                    controller_pb2.GetFunctionRequest(name=name),
                )
                self.specs[name] = spec
                fut.set_result(spec)
            except grpc.aio.AioRpcError as e:
                err: Exception = (
                    NotFound(e.details() or f"function {validation.short(name)} not found")
                    if e.code() == grpc.StatusCode.NOT_FOUND
                    else Unavailable(
                        f"cannot get the spec of {validation.short(name)} from the controller: "
                        f"{e.details()}"
                    )
                )
                fut.set_exception(err)
            finally:
                del self._fetches[name]
        return await asyncio.shield(fut)
