"""Dispatch gRPC servicer: a thin adapter over ``Dispatcher``.

Each RPC validates its request, calls the ``Dispatcher`` (this instance's
state and decisions: ``dispatcher.py``) and maps the result, or the
``GalaxyError`` it raised, to the reply. A request for a function another
instance owns is forwarded once to its owner.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from controlplane.runtime import authn, leasetoken, validation
from functions.dispatch import coordination, fnstats, stream
from functions.dispatch.dispatcher import Dispatcher, Served
from functions.dispatch.ownership import lease_revision
from functions.dispatch.peers import FORWARD_RELEASE_S
from functions.dispatch.policy import FunctionRouter
from functions.dispatch.waits import MAX_WAIT_S
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc

log = logging.getLogger(__name__)


class DispatchServicer(dispatch_pb2_grpc.DispatchServicer):
    """The Dispatch RPCs of one ``Dispatcher`` (built from the same keyword
    arguments)."""

    def __init__(self, **kwargs: Any) -> None:
        #: the state and decisions this servicer serves
        self.dispatcher = Dispatcher(**kwargs)
        #: signs each lease for the node's entry (None: leases carry no token)
        self.lease_key: leasetoken.LeaseKey | None = None

    # Read-only views of the dispatcher, for `galaxy status` and tests.

    def router_of(self, function: str) -> FunctionRouter:
        """``Dispatcher.router_of``."""
        return self.dispatcher.router_of(function)

    def routes(self, function: str) -> bool:
        """``Dispatcher.routes``."""
        return self.dispatcher.routes(function)

    @property
    def routers(self) -> dict[str, FunctionRouter]:
        """``Dispatcher.routers``."""
        return self.dispatcher.routers

    @property
    def ops(self) -> dict[str, int]:
        """``Dispatcher.ops``."""
        return self.dispatcher.ops

    def _release_if_abandoned(
        self, context: grpc.aio.ServicerContext, router: FunctionRouter, lease_id: str
    ) -> None:
        """Free the slot if the answer never reaches the caller: a deadline
        that expires (or a cancel) between the grant and the answer's
        delivery leaves no one to Release it, so it would be held for the
        whole lease."""

        def done(ctx: grpc.aio.ServicerContext) -> None:
            if ctx.cancelled():
                self.dispatcher.abandoned(router, lease_id)

        context.add_done_callback(done)

    def _reply(self, s: Served) -> dispatch_pb2.InstanceAddr:
        g = s.grant
        token = ""
        if self.lease_key is not None:  # the node's entry admits this lease until it ends
            ends_ms = time.time_ns() // 1_000_000 + int(s.ttl_s * 1000)
            token = self.lease_key.sign(g.instance.instance_id, ends_ms)
        spec = self.dispatcher.specs.get(s.router.name)
        return dispatch_pb2.InstanceAddr(
            pd=spec.pd if spec is not None and spec.pd.prefill else None,
            function=g.instance.meta.function if g.instance.meta else "",
            instance_id=g.instance.instance_id,
            address=g.instance.address,
            node_id=g.instance.node_id,
            lease_id=g.lease_id,
            cold_start=g.cold_start,
            wait_ms=s.wait_s * 1000.0,
            lease_ttl_ms=int(s.ttl_s * 1000),
            hold_ms=int(s.hold_s * 1000),
            lease_token=token,
        )

    # -- public API -------------------------------------------------------

    @fnstats.recorded
    async def Dispatch(
        self, request: dispatch_pb2.DispatchRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.InstanceAddr:
        validation.check_dispatch(request)
        d = self.dispatcher
        # Piggybacked releases first: the slot they free may serve this request.
        d.release_many(request.releases)
        owner = d.owner(request.function)
        if owner is not None and not request.forwarded:
            if d.ownership.handing_over(request.function):
                owner = await coordination.held(d, request.function)
            return await self._forward(owner, request, context)
        try:
            served = await d.serve(request, context.time_remaining)
        except coordination.Moved as moved:
            # Repartitioned while waiting: the new owner serves it (one hop).
            return await self._forward(moved.owner, request, context)
        if served.fresh:
            self._release_if_abandoned(context, served.router, served.grant.lease_id)
        return self._reply(served)

    async def _forward(
        self,
        owner: common_pb2.ControlInstance,
        request: dispatch_pb2.DispatchRequest,
        context: grpc.aio.ServicerContext,
    ) -> dispatch_pb2.InstanceAddr:
        self.dispatcher.ops["forwarded"] += 1
        fwd = dispatch_pb2.DispatchRequest()
        fwd.CopyFrom(request)
        fwd.forwarded = True
        remaining = context.time_remaining()
        # The owner checks the caller's namespace: it has the spec.
        md = authn.forwarded_metadata(context)
        try:
            async with self.dispatcher.pool.stub(
                owner.address, dispatch_pb2_grpc.DispatchStub
            ) as s:
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
        d = self.dispatcher
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            # The owner may be dead: have the controller check it now, so
            # the function moves here (or elsewhere) without waiting for
            # the owner to fall silent.
            d.peers.report_unreachable(d.controller, owner)
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
        d = self.dispatcher
        # The lease id names the revision its slot is filed under; the
        # function field is only checked (a client may send the function's
        # name or the revision's: either is the same owner).
        fn = lease_revision(request.lease_id)
        if fn is None:
            return dispatch_pb2.ReleaseReply(released=False)  # no Dispatch issued it
        owner = d.owner(fn)
        if owner is not None and not request.forwarded:
            fwd = dispatch_pb2.ReleaseRequest(
                function=fn, lease_id=request.lease_id, forwarded=True
            )
            remaining = context.time_remaining()
            try:
                async with d.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                    return await s.Release(  # type: ignore[no-any-return]
                        fwd, timeout=FORWARD_RELEASE_S if remaining is None else remaining
                    )
            except grpc.aio.AioRpcError as e:
                await self._forward_failed(owner, e, context, "forwarded release failed")
                raise  # unreachable: _forward_failed aborts
        return dispatch_pb2.ReleaseReply(released=d.release(fn, request.lease_id))

    # -- internal API -----------------------------------------------------

    async def ModInstance(
        self, request: dispatch_pb2.ModInstanceRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.ModInstanceReply:
        return await coordination.mod_instance(self.dispatcher, request)

    async def Coordinate(
        self, request: common_pb2.CoordinateRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CoordinateReply:
        return await coordination.coordinate(self.dispatcher, request)

    async def ListInstances(
        self, request: dispatch_pb2.ListInstancesRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb2.ListInstancesReply:
        return coordination.list_instances(self.dispatcher, request)
