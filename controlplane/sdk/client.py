"""Python client SDK for Galaxy: async ``GalaxyClient`` and ``SyncGalaxyClient``.

The client learns the Dispatch instances from the controller and sends each
request straight to the instance that owns its function (rendezvous hashing,
the same rule the servers use), so no hop is wasted.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.errors import FailedPrecondition
from controlplane.runtime.membership import MembershipView
from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
)

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
# How long a deferred release waits for a Dispatch call to ride on.
RELEASE_DELAY_S = 0.002


@dataclass
class InvokeResult:
    """What ``invoke`` returns: where the request ran and what it answered."""

    instance: dispatch_pb2.InstanceAddr
    status: int
    body: bytes

    def text(self) -> str:
        """The answer body as text."""
        return self.body.decode("utf-8", "replace")


class GalaxyClient:
    """Async client of one Galaxy control plane (controller address)."""

    def __init__(self, controller: str, timeout: float = 30.0) -> None:
        self.controller = controller
        self.timeout = timeout
        self.pool = rpc.ChannelPool(timeout=timeout)
        self.membership = MembershipView()
        # Deferred releases by owner address, sent with the next Dispatch to
        # that owner or by a flush RELEASE_DELAY_S later, whichever is first.
        self._pending: dict[str, list[dispatch_pb2.ReleaseRequest]] = {}
        self._flushes: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> GalaxyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send deferred releases, then close channels."""
        for address in list(self._pending):
            await self._flush(address)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pool.close()

    async def _ctl(self, method: str, request: Any) -> Any:
        async with self.pool.stub(self.controller, controller_pb2_grpc.ControllerStub) as s:
            return await getattr(s, method)(request)

    # -- admin ------------------------------------------------------------

    async def deploy(self, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
        """Deploy (or replace) a function; durable when this returns."""
        return await self._ctl(
            "DeployFunction", controller_pb2.DeployFunctionRequest(function=spec)
        )  # type: ignore[no-any-return]

    async def get_function(self, name: str) -> common_pb2.FunctionSpec:
        """The stored spec of a function (NOT_FOUND if none)."""
        return await self._ctl("GetFunction", controller_pb2.GetFunctionRequest(name=name))  # type: ignore[no-any-return]

    async def list_functions(self) -> list[common_pb2.FunctionSpec]:
        """All deployed functions."""
        r = await self._ctl("ListFunctions", controller_pb2.ListFunctionsRequest())
        return list(r.functions)

    async def delete_function(self, name: str) -> None:
        """Delete a function and its instances."""
        await self._ctl("DeleteFunction", controller_pb2.DeleteFunctionRequest(name=name))

    async def status(self) -> controller_pb2.ClusterStatus:
        """Control instances, nodes, functions and instances."""
        return await self._ctl("GetClusterStatus", controller_pb2.GetClusterStatusRequest())  # type: ignore[no-any-return]

    async def refresh_membership(self) -> None:
        """Fetch the current Dispatch instances from the controller."""
        self.membership.update(
            await self._ctl("GetMembership", controller_pb2.GetMembershipRequest())
        )

    # -- data path --------------------------------------------------------

    async def dispatch(self, function: str, request_id: str = "") -> dispatch_pb2.InstanceAddr:
        """Reserve a slot on an instance of function (may cold-start one).

        If the owning Dispatch instance is gone (UNAVAILABLE: scaled in or
        crashed), the membership is fetched again and the request retried
        once at the new owner.
        """
        if not self.membership.ids(DISPATCH):
            await self.refresh_membership()
        req = dispatch_pb2.DispatchRequest(function=function, request_id=request_id)
        for attempt in (0, 1):
            owner = self.membership.owner(DISPATCH, function)
            if owner is None:
                raise FailedPrecondition("no Dispatch instance is registered with the controller")
            req.releases.extend(self._take_pending(owner.address))
            try:
                async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                    return await s.Dispatch(req)  # type: ignore[no-any-return]
            except grpc.aio.AioRpcError as e:
                if req.releases:
                    # Maybe not applied: send them on their own (a repeat is harmless).
                    self._pending.setdefault(owner.address, []).extend(req.releases)
                    del req.releases[:]
                    self._flush_soon(owner.address)
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt:
                    raise
                await self.refresh_membership()
                if self.membership.owner(DISPATCH, function) == owner:
                    raise  # same owner: a real outage, let the caller back off
        raise AssertionError("unreachable")

    async def release(self, addr: dispatch_pb2.InstanceAddr, defer: bool = False) -> bool:
        """Give back the slot of a dispatch() result.

        defer=True sends it with the next dispatch() to the same Dispatch
        instance, or on its own RELEASE_DELAY_S later: one RPC per request
        instead of two for a busy caller. Returns True when deferred.
        """
        if not self.membership.ids(DISPATCH):
            await self.refresh_membership()
        owner = self.membership.owner(DISPATCH, addr.function)
        if owner is None:
            return False
        rel = dispatch_pb2.ReleaseRequest(function=addr.function, lease_id=addr.lease_id)
        if defer:
            self._pending.setdefault(owner.address, []).append(rel)
            if owner.address not in self._flushes:
                loop = asyncio.get_running_loop()
                self._flushes[owner.address] = loop.call_later(
                    RELEASE_DELAY_S, self._flush_soon, owner.address
                )
            return True
        async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
            r = await s.Release(rel)
        return bool(r.released)

    def _take_pending(self, address: str) -> list[dispatch_pb2.ReleaseRequest]:
        timer = self._flushes.pop(address, None)
        if timer is not None:
            timer.cancel()
        return self._pending.pop(address, [])

    def _flush_soon(self, address: str) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(address))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, address: str) -> None:
        rels = self._take_pending(address)
        if not rels:
            return
        async with self.pool.stub(address, dispatch_pb2_grpc.DispatchStub) as s:
            await asyncio.gather(*(s.Release(r) for r in rels), return_exceptions=True)

    async def invoke(self, function: str, data: bytes, path: str = "/") -> InvokeResult:
        """Dispatch, POST data to the instance over HTTP, release the slot."""
        addr = await self.dispatch(function)
        try:
            status, body = await http_post(addr.address, path, data, self.timeout)
        finally:
            await self.release(addr, defer=True)
        return InvokeResult(addr, status, body)


async def http_post(address: str, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
    """Minimal HTTP/1.1 POST over asyncio streams (no extra dependency)."""
    if address.startswith("emulated://"):
        # Emulated sandboxes have no process: answer like an echo would.
        return 200, json.dumps(
            {"echo": body.decode("utf-8", "replace"), "emulated": address}
        ).encode()
    host, port = address.rsplit(":", 1)

    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {len(body)}\r\n"
                "Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        header, _, payload = raw.partition(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        return status, payload

    return await asyncio.wait_for(go(), timeout_s)


class SyncGalaxyClient:
    """Blocking wrapper of GalaxyClient for scripts (one private event loop)."""

    def __init__(self, controller: str, timeout: float = 30.0) -> None:
        self._runner = asyncio.Runner()
        self._client = self._runner.run(self._make(controller, timeout))

    @staticmethod
    async def _make(controller: str, timeout_s: float) -> GalaxyClient:
        return GalaxyClient(controller, timeout_s)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        """Close channels and the loop."""
        self._runner.run(self._client.close())
        self._runner.close()

    def __enter__(self) -> SyncGalaxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
