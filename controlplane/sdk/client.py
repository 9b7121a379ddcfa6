"""Python client SDK for Galaxy: async ``GalaxyClient`` and ``SyncGalaxyClient``.

The client learns the Dispatch instances from the controller and sends each
request straight to the instance that owns its function (rendezvous hashing,
the same rule the servers use), so no hop is wasted.

Failures it absorbs (docs/reliability.md): a Dispatch instance that is
unavailable is skipped for the next one in rendezvous order (any instance
forwards to the owner, and the next in order is the owner once the dead one
leaves the membership), with jittered backoff inside the caller's deadline;
an instance that cannot be reached after its grant is replaced by another
grant (the request never left, so this is safe for any request). Every
error it raises is a ``GalaxyError`` subclass carrying the gRPC code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from controlplane.runtime import authn, controllers
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.errors import (
    DISPATCH_RETRYABLE,
    DeadlineExceeded,
    FailedPrecondition,
    GalaxyError,
    from_rpc_error,
)
from controlplane.runtime.membership import MembershipView
from controlplane.runtime.revisions import routing_key
from controlplane.runtime.rpc import ChannelPool
from controlplane.runtime.tls import TlsConfig
from controlplane.runtime.validation import short
from controlplane.sdk.graphcalls import GRAPH_READS, GraphCalls
from controlplane.sdk.http import HttpPool, NotSent
from controlplane.sdk.retry import Backoff
from controlplane.sdk.streams import DispatchStreams
from galaxy.v1 import common_pb2, controller_pb2, dispatch_pb2, dispatch_pb2_grpc

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
# How long a deferred release waits for a Dispatch call to ride on.
RELEASE_DELAY_S = 0.002
# Controller calls that change nothing: safe to repeat while it fails over.
_READS = GRAPH_READS | {"GetMembership", "GetClusterStatus", "GetFunction"}
_READS |= {"ListFunctions", "ListRevisions"}


@dataclass
class InvokeResult:
    """What ``invoke`` returns: where the request ran and what it answered."""

    instance: dispatch_pb2.InstanceAddr
    status: int
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """The answer body as text."""
        return self.body.decode("utf-8", "replace")


#: The SDK's default timeout, s (a call may wait for a cold start).
TIMEOUT_S = 30.0


class GalaxyClient(GraphCalls):
    """Async client of one Galaxy control plane.

    controller: the controller's host:port, or several (a list, or
    comma-separated: `galaxy up --ha`); a controller that is UNAVAILABLE is
    passed over for the next (``controlplane.runtime.controllers``).
    rpc: ``deadline_s``, the timeout of each RPC and of a call with its
    retries; ``tls``, a client certificate of the cluster's CA
    (``tlsfiles.client_tls``; None: plaintext); ``token``, sent with every
    call (``credentials.client_token``; None: none). Or give timeout
    (default ``TIMEOUT_S``), tls and token, which make that RpcConfig.
    streams: Dispatch requests as messages on a stream per instance (False: unary)."""

    def __init__(
        self,
        controller: str | Sequence[str],
        timeout: float | None = None,
        backoff: Backoff | None = None,
        tls: TlsConfig | None = None,
        token: str | None = None,
        rpc: RpcConfig | None = None,
        streams: bool = True,
    ) -> None:
        #: The controllers' addresses, tried in turn on UNAVAILABLE.
        self.controllers = controllers.split(controller)
        if not self.controllers:
            raise ValueError("no controller address given")
        if rpc is not None and (timeout, tls, token) != (None, None, None):
            raise ValueError("GalaxyClient: give timeout, tls and token inside rpc, not beside it")
        timeout = TIMEOUT_S if timeout is None else timeout
        rpc = rpc or RpcConfig(deadline_s=timeout, tls=tls, token=token)
        self._md = authn.token_metadata(rpc.token)
        self.timeout = rpc.deadline_s
        self.pool = ChannelPool(rpc)
        self.http = HttpPool()
        self.backoff = backoff or Backoff()
        self.membership = MembershipView()
        #: Failovers made (a Dispatch instance skipped or waited for, one replaced).
        self.failovers = 0
        # Deferred releases by owner: on its next Dispatch, or RELEASE_DELAY_S later.
        self._pending: dict[str, list[dispatch_pb2.ReleaseRequest]] = {}
        self._flushes: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: How Dispatch requests (and releases) travel: streams or unary calls.
        self.streams = DispatchStreams(self.pool, self._release_orphan, enabled=streams)

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
        await self.streams.close()
        await self.http.close()
        await self.pool.close()

    @property
    def controller(self) -> str:
        """The controllers' addresses, comma-separated."""
        return ",".join(self.controllers)

    async def _ctl(
        self, method: str, request: Any, retry_s: float | None = None, token: str | None = None
    ) -> Any:
        """Call the controller. A read that every controller answers with
        UNAVAILABLE (one is down and the other has no leader yet: an
        election lasts up to the lease TTL) is retried with backoff for
        ``retry_s`` (default: the client's timeout); a change is not (it may
        have been applied). token: sent instead of the client's own."""
        loop = asyncio.get_running_loop()
        retry = method in _READS
        deadline = loop.time() + (self.timeout if retry_s is None else retry_s)
        attempts = 0
        md = authn.token_metadata(token) if token else self._md
        while True:
            try:
                return await controllers.call(
                    self.pool, self.controllers, method, request, metadata=md
                )
            except grpc.aio.AioRpcError as e:
                attempts += 1
                delay = self.backoff.delay(attempts, loop.time(), deadline)
                if not retry or e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
                    raise from_rpc_error(e) from None
                await asyncio.sleep(delay)

    # -- admin ------------------------------------------------------------

    async def deploy(self, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
        """Deploy (or replace) a function; durable when this returns. The
        spec names a registered runtime (``put_runtime``) and sets no
        command; the answer is the stored spec, with the resolved command."""
        return await self._ctl(
            "DeployFunction", controller_pb2.DeployFunctionRequest(function=spec)
        )  # type: ignore[no-any-return]

    async def get_function(self, name: str) -> common_pb2.FunctionSpec:
        """The stored spec of a function (NOT_FOUND if none)."""
        return await self._ctl("GetFunction", controller_pb2.GetFunctionRequest(name=name))  # type: ignore[no-any-return]

    async def list_revisions(self, name: str) -> controller_pb2.ListRevisionsReply:
        """A function's revisions (oldest first) and its traffic split."""
        return await self._ctl("ListRevisions", controller_pb2.ListRevisionsRequest(name=name))  # type: ignore[no-any-return]

    async def set_traffic(
        self, name: str, traffic: list[common_pb2.TrafficTarget]
    ) -> common_pb2.FunctionSpec:
        """Replace a function's traffic split (canary, pin, rollback)."""
        req = controller_pb2.SetTrafficRequest(name=name, traffic=traffic)
        return await self._ctl("SetTraffic", req)  # type: ignore[no-any-return]

    async def list_functions(self, token: str | None = None) -> list[common_pb2.FunctionSpec]:
        """The deployed functions the caller may see (all, for an admin)."""
        r = await self._ctl("ListFunctions", controller_pb2.ListFunctionsRequest(), token=token)
        return list(r.functions)

    async def create_token(
        self, name: str, role: str, namespace: str = ""
    ) -> controller_pb2.CreateTokenReply:
        """A new bearer token (admin only); its secret is in the reply only."""
        req = controller_pb2.CreateTokenRequest(name=name, role=role, namespace=namespace)
        return await self._ctl("CreateToken", req)  # type: ignore[no-any-return]

    async def list_tokens(self) -> list[controller_pb2.TokenInfo]:
        """Every token's public record (admin only)."""
        r = await self._ctl("ListTokens", controller_pb2.ListTokensRequest())
        return list(r.tokens)

    async def delete_token(self, token_id: str) -> None:
        """Revoke a token (admin only)."""
        await self._ctl("DeleteToken", controller_pb2.DeleteTokenRequest(id=token_id))

    async def delete_function(self, name: str) -> None:
        """Delete a function and its instances."""
        await self._ctl("DeleteFunction", controller_pb2.DeleteFunctionRequest(name=name))

    async def put_runtime(self, runtime: common_pb2.ServingRuntime) -> common_pb2.ServingRuntime:
        """Register or replace a serving runtime (idempotent); durable when
        this returns. Deployed functions keep their command until redeployed."""
        req = controller_pb2.PutRuntimeRequest(runtime=runtime)
        return await self._ctl("PutRuntime", req)  # type: ignore[no-any-return]

    async def get_runtime(self, name: str) -> common_pb2.ServingRuntime:
        """A serving runtime (NOT_FOUND if none)."""
        return await self._ctl("GetRuntime", controller_pb2.GetRuntimeRequest(name=name))  # type: ignore[no-any-return]

    async def list_runtimes(self) -> list[common_pb2.ServingRuntime]:
        """Every serving runtime, by name."""
        r = await self._ctl("ListRuntimes", controller_pb2.ListRuntimesRequest())
        return list(r.runtimes)

    async def delete_runtime(self, name: str) -> None:
        """Delete a serving runtime (FAILED_PRECONDITION while a function uses it)."""
        await self._ctl("DeleteRuntime", controller_pb2.DeleteRuntimeRequest(name=name))

    async def status(self) -> controller_pb2.ClusterStatus:
        """Control instances, nodes, functions and instances."""
        return await self._ctl("GetClusterStatus", controller_pb2.GetClusterStatusRequest())  # type: ignore[no-any-return]

    async def failover_pause(self, attempts: int, deadline: float) -> bool:
        """Before trying again after ``attempts`` failed (loop time
        ``deadline``): False when no further attempt fits (the caller
        raises); else count a failover and wait the jittered backoff."""
        loop = asyncio.get_running_loop()
        delay = self.backoff.delay(attempts, loop.time(), deadline)
        if delay is None:
            return False
        self.failovers += 1
        await asyncio.sleep(delay)
        return True

    async def refresh_membership(self, retry_s: float | None = None) -> None:
        """Fetch the current Dispatch instances from the controller. What the
        controller answers is the truth even when its epoch is lower than
        the one held (a restarted controller), so it replaces the view.
        retry_s: how long to retry while no controller can answer (default:
        the client's timeout)."""
        m = await self._ctl("GetMembership", controller_pb2.GetMembershipRequest(), retry_s)
        view = MembershipView()
        view.update(m)
        self.membership = view

    # -- data path --------------------------------------------------------

    async def dispatch(
        self,
        function: str,
        request_id: str = "",
        deadline_s: float | None = None,
        tag: str = "",
        token: str | None = None,
        hold: bool = False,
        hint: dispatch_pb2.RoutingHint | None = None,
    ) -> dispatch_pb2.InstanceAddr:
        """Reserve a slot on an instance of function (may cold-start one).

        function may name a revision (NAME-NNNNN) to pin it; tag picks the
        revision with that traffic tag. Otherwise the function's traffic
        split decides. token: sent instead of the client's own (the
        gateway passes on each HTTP client's). hold: ask to keep the lease
        for later requests (``InstanceAddr.hold_ms``; the gateway's cache);
        hint: what an LLM function's picker reads (the gateway's OpenAI routes).

        Dispatch instances are tried in rendezvous order for the function:
        one that is unavailable (crashed, scaled in) is skipped for the next,
        with jittered backoff, for at most ``deadline_s`` seconds (default:
        the client's timeout). A request id is made when none is given, so a
        retry is the same request to Dispatch.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (deadline_s or self.timeout)
        md = authn.token_metadata(token) if token else self._md
        if not self.membership.ids(DISPATCH):
            await self.refresh_membership()
        rid = request_id or uuid.uuid4().hex
        req = dispatch_pb2.DispatchRequest(function=function, request_id=rid, tag=tag, hold=hold)
        if hint is not None:
            req.hint.CopyFrom(hint)
        key = routing_key(function)  # revisions live with their function
        attempts, skipped = 0, set[str]()
        while True:
            ranked = [m for m in self.membership.ranked(DISPATCH, key) if m.id not in skipped]
            attempts += 1
            if not ranked and not self.membership.ids(DISPATCH):
                # None registered (a start, a restart, a controller taking
                # over): wait for one, within the deadline, as for a failover.
                if not await self.failover_pause(attempts, deadline):
                    raise FailedPrecondition(
                        "no Dispatch instance is registered with the controller"
                    )
                with contextlib.suppress(GalaxyError):
                    await self.refresh_membership(retry_s=0)
                continue
            if not ranked:
                skipped.clear()  # every one failed once: start over after a backoff
                ranked = self.membership.ranked(DISPATCH, key)
            target = ranked[0]
            req.releases.extend(self._take_pending(target.address))
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceeded(f"dispatch {short(function)}: deadline exceeded")
            try:
                return await self.streams.dispatch(target.address, req, remaining, md)
            except grpc.aio.AioRpcError as e:
                if req.releases:
                    # Maybe not applied: send them on their own (a repeat is harmless).
                    self._pending.setdefault(target.address, []).extend(req.releases)
                    del req.releases[:]
                    self._flush_soon(target.address)
                if e.code() not in DISPATCH_RETRYABLE:
                    raise from_rpc_error(e) from None
                if not await self.failover_pause(attempts, deadline):
                    raise from_rpc_error(e) from None
                skipped.add(target.id)
                try:
                    # Once: a controller failing over too must not hold the
                    # request past its deadline; the old view is kept.
                    await self.refresh_membership(retry_s=0)
                except GalaxyError:
                    pass

    async def release(self, addr: dispatch_pb2.InstanceAddr, defer: bool = False) -> bool:
        """Give back the slot of a dispatch() result.

        defer=True sends it with the next dispatch() to its Dispatch instance
        or RELEASE_DELAY_S later (a message on the open stream, else a call):
        one message per request instead of two. Returns True if deferred.
        """
        if not self.membership.ids(DISPATCH):
            await self.refresh_membership()
        owner = self.membership.owner(DISPATCH, routing_key(addr.function))
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
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                r = await s.Release(rel, metadata=self._md)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        return bool(r.released)

    def _take_pending(self, address: str) -> list[dispatch_pb2.ReleaseRequest]:
        timer = self._flushes.pop(address, None)
        if timer is not None:
            timer.cancel()
        return self._pending.pop(address, [])

    def _flush_soon(self, address: str) -> None:
        rels = self._take_pending(address)
        if rels and not self.streams.release(address, rels):
            self._spawn(self._send_releases(address, rels))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _release_orphan(self, addr: dispatch_pb2.InstanceAddr) -> None:
        """A slot granted after its request was given up: give it back."""
        self._spawn(self._release_quietly(addr))

    async def _release_quietly(self, addr: dispatch_pb2.InstanceAddr) -> None:
        with contextlib.suppress(GalaxyError):
            await self.release(addr, defer=True)

    async def _flush(self, address: str) -> None:
        rels = self._take_pending(address)
        if rels and not self.streams.release(address, rels):
            await self._send_releases(address, rels)

    async def _send_releases(self, address: str, rels: list[dispatch_pb2.ReleaseRequest]) -> None:
        async with self.pool.stub(address, dispatch_pb2_grpc.DispatchStub) as s:
            await asyncio.gather(
                *(s.Release(r, metadata=self._md) for r in rels), return_exceptions=True
            )

    async def invoke(
        self,
        function: str,
        data: bytes,
        path: str = "/",
        headers: dict[str, str] | None = None,
        method: str = "POST",
        tag: str = "",
    ) -> InvokeResult:
        """Dispatch, send the request to the instance over HTTP, release the
        slot. An instance that cannot be reached is replaced by another grant
        (the request was never sent)."""
        async with self.granted(function, path, data, headers, method, tag) as (addr, resp):
            if resp is None:
                return InvokeResult(addr, 200, _emulated_body(addr, data))
            body = await resp.read()
            return InvokeResult(addr, resp.status, body, dict(resp.headers))

    async def invoke_stream(
        self,
        function: str,
        data: bytes,
        path: str = "/",
        headers: dict[str, str] | None = None,
        method: str = "POST",
        tag: str = "",
    ) -> AsyncIterator[bytes]:
        """Like ``invoke``, yielding the body as the instance produces it
        (chunked responses and server-sent events arrive chunk by chunk,
        without their transfer framing)."""
        async with self.granted(function, path, data, headers, method, tag) as (addr, resp):
            if resp is None:
                yield _emulated_body(addr, data)
                return
            async for chunk in resp.content.iter_any():
                yield chunk

    @asynccontextmanager
    async def granted(
        self,
        function: str,
        path: str,
        data: bytes,
        headers: dict[str, str] | None,
        method: str,
        tag: str = "",
        token: str | None = None,
    ) -> AsyncIterator[tuple[dispatch_pb2.InstanceAddr, Any]]:
        """A slot on an instance of ``function`` and the instance's response
        to the request (its body unread; None for an emulated sandbox); the
        slot is released when the block ends, however it ends. An instance
        that cannot be reached is replaced by another grant."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        held: list[dispatch_pb2.InstanceAddr] = []
        attempts = 0
        try:
            while True:
                addr = await self.dispatch(
                    function, deadline_s=max(deadline - loop.time(), 0.001), tag=tag, token=token
                )
                attempts += 1
                if addr.address.startswith("emulated://"):
                    held.append(addr)
                    yield addr, None
                    return
                # The function's request timeout (the lease's lifetime) bounds
                # the exchange too: past it the slot may be someone else's.
                limit = max(deadline - loop.time(), 0.001)
                if addr.lease_ttl_ms:
                    limit = min(limit, addr.lease_ttl_ms / 1000.0)
                try:
                    async with self.http.open(
                        addr.address, path, data, limit, method, headers, addr.lease_token
                    ) as resp:
                        held.append(addr)
                        yield addr, resp
                        return
                except NotSent:
                    # Keep the dead instance's slot while asking again, so the
                    # next grant goes elsewhere; released below either way.
                    held.append(addr)
                    if not await self.failover_pause(attempts, deadline):
                        raise
        finally:
            for a in held:
                try:
                    await self.release(a, defer=True)
                except GalaxyError:
                    pass  # its Dispatch is gone: the lease goes with it


def _emulated_body(addr: dispatch_pb2.InstanceAddr, data: bytes) -> bytes:
    # Emulated sandboxes have no process: answer like an echo would.
    return json.dumps({"echo": data.decode("utf-8", "replace"), "emulated": addr.address}).encode()
