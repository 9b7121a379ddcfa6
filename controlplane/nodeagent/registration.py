"""Keeps a node agent's nodes registered with ClusterMgr and heartbeating.

Each node belongs to one ClusterMgr instance (rendezvous hashing over the
controller's membership). One loop serves every node of the pool: it wakes
when the earliest heartbeat is due and sends all heartbeats due by then
concurrently, so a pool of 210 emulated nodes costs one loop, not 210
sleeping tasks. Each node's first heartbeat after registering is offset by a
fraction of the interval, which spreads the pool's heartbeats over the period.
Heartbeats (Update) to one ClusterMgr instance share one stream
(heartbeat_stream.py), where a round's statuses go as one batch; with batches
a round takes every node due within a quarter of the interval
(heartbeat_modes.round_window_s), so the pool's beats gather into a few
batches per interval. Registering stays a unary RegisterNode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from controlplane.nodeagent.heartbeat_modes import ROUND_WINDOW_S, round_window_s
from controlplane.nodeagent.heartbeat_stream import Streams
from controlplane.runtime import controllers, rpc
from controlplane.runtime.membership import (
    HEARTBEAT_STREAM_MAX_AGE_S,
    NODE_HEARTBEAT_MS,
    MembershipView,
)
from galaxy.v1 import clustermgr_pb2_grpc, common_pb2, controller_pb2

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_MS = NODE_HEARTBEAT_MS
_FIRST_BACKOFF_S = 0.05


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


@dataclass(eq=False)
class _NodeState:
    node_id: str
    next_due: float = 0.0
    owner_address: str = ""
    registered: bool = False
    failures: int = 0
    # A register/heartbeat RPC for this node is in flight.
    busy: bool = False
    # Fraction of the interval before the first heartbeat after registering:
    # spreads a pool's heartbeats over the period instead of one burst.
    phase: float = 1.0
    event: asyncio.Event = field(default_factory=asyncio.Event)
    # report_soon was asked while a beat was in flight: send again at once.
    again: bool = False


class Registrar:
    """Registers nodes with their owning ClusterMgr and sends heartbeats.

    status_of(node_id) must return the node's current NodeStatus with a fresh
    (higher) seq; it is called once per status sent. The loop never raises: on
    any error it re-fetches the membership from the controller and retries
    with capped exponential backoff.
    """

    def __init__(
        self,
        node_ids: Iterable[str],
        status_of: Callable[[str], common_pb2.NodeStatus],
        controller: str,
        pool: rpc.ChannelPool,
        *,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_MS,
        rpc_timeout_s: float = 2.0,
        membership_refresh_s: float = 5.0,
        max_backoff_s: float = 2.0,
        stream_max_age_s: float = HEARTBEAT_STREAM_MAX_AGE_S,
    ) -> None:
        self.controller = controller
        self.pool = pool
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rpc_timeout_s = rpc_timeout_s
        self.membership_refresh_s = membership_refresh_s
        self.max_backoff_s = max_backoff_s
        self.view = MembershipView()
        #: Heartbeat streams by ClusterMgr address.
        self.streams = Streams(pool, rpc_timeout_s=rpc_timeout_s, max_age_s=stream_max_age_s)
        self._status_of = status_of
        # The interval ClusterMgr last told (the round window follows it).
        self._interval_s = heartbeat_interval_ms / 1000
        ids = list(node_ids)
        self._nodes = {n: _NodeState(n, phase=(i + 1) / len(ids)) for i, n in enumerate(ids)}
        #: Set once every node has registered at least once.
        self.registered = asyncio.Event()
        if not self._nodes:
            self.registered.set()
        self._membership_due = 0.0
        self._membership_last = 0.0
        self._membership_failures = 0
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._refreshing = False
        # Heartbeats wait for the first membership: without it every node
        # would fail (no owner known) and back off for nothing.
        self._fetched = False

    def node_registered(self, node_id: str) -> asyncio.Event:
        """Event set once node_id has registered at least once."""
        return self._nodes[node_id].event

    def report_soon(self, node_id: str) -> None:
        """Send node_id's status now rather than at its next heartbeat (its
        instances freed capacity: the owning Schedule instance, which keeps
        an exact view of its partition, learns of frees only from
        statuses). Reports asked while one is in flight coalesce into one
        more, right after it."""
        st = self._nodes.get(node_id)
        if st is None:
            return
        if st.busy:
            st.again = True
        else:
            st.next_due = 0.0
        self._wake.set()

    def is_registered(self, node_id: str) -> bool:
        """True while node_id counts as registered with its current owner."""
        return self._nodes[node_id].registered

    async def start(self) -> None:
        """Start the background loop (returns at once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="nodeagent-registration")

    async def stop(self) -> None:
        """Stop the loop; in-flight RPCs are cancelled."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _backoff(self, failures: int) -> float:
        return float(min(_FIRST_BACKOFF_S * 2 ** min(failures, 16), self.max_backoff_s))

    def _want_membership(self) -> None:
        """Refresh the membership soon, but not faster than the backoff allows."""
        earliest = self._membership_last + self._backoff(self._membership_failures)
        self._membership_due = min(self._membership_due, earliest)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("registration task failed", exc_info=task.exception())
        self._wake.set()

    async def _run(self) -> None:
        # The loop itself never awaits an RPC: refreshes and heartbeat batches
        # run as tasks, so one hung ClusterMgr (or controller) delays no other
        # node's heartbeat. A finished task wakes the loop to reschedule.
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = loop.time()
                if now >= self._membership_due and not self._refreshing:
                    self._refreshing = True
                    self._spawn(self._refresh_membership())
                if self._fetched:
                    ahead = now + round_window_s(self._interval_s, self.streams.batching)
                    due = [s for s in self._nodes.values() if not s.busy and s.next_due <= ahead]
                    if due:
                        for s in due:
                            s.busy = True
                        self._spawn(self._beat_batch(due))
                idle = [s.next_due for s in self._nodes.values() if not s.busy and self._fetched]
                wake = min([self._membership_due if not self._refreshing else math.inf, *idle])
                self._wake.clear()
                # Waits for the next heartbeat time or a finished task.
                # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a
                # cancel that races the wake-up, and stop() would never return.
                delay = max(min(wake - loop.time(), 3600.0), ROUND_WINDOW_S)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        finally:
            for t in list(self._inflight):
                t.cancel()
            await asyncio.gather(*self._inflight, return_exceptions=True)
            await self.streams.close()

    async def _beat_batch(self, batch: list[_NodeState]) -> None:
        async def one(st: _NodeState) -> str | None:
            try:
                return await self._beat(st)
            finally:
                # Per node, not per batch: a node whose peer hangs must not
                # hold back the others sent with it.
                st.busy = False
                self._wake.set()

        errors = await asyncio.gather(*(one(s) for s in batch))
        self._log_failures(batch, errors)

    async def _refresh_membership(self) -> None:
        try:
            await self._fetch_membership()
        finally:
            self._refreshing = False

    async def _fetch_membership(self) -> None:
        loop = asyncio.get_running_loop()
        self._membership_last = loop.time()
        try:
            m = await controllers.call(
                self.pool,
                self.controller,
                "GetMembership",
                controller_pb2.GetMembershipRequest(),
                timeout_s=self.rpc_timeout_s,
            )
        except Exception as e:
            self._membership_failures += 1
            if self._membership_failures == 1:
                log.warning(
                    "cannot fetch membership from controller %s: %s", self.controller, _describe(e)
                )
            self._membership_due = loop.time() + self._backoff(self._membership_failures)
            return
        if self._membership_failures:
            log.info("membership fetched from controller %s again", self.controller)
        self._membership_failures = 0
        # The controller's answer is authoritative: a lower epoch means it
        # restarted, not that the answer is stale.
        if m.epoch < self.view.epoch:
            self.view = MembershipView()
        self.view.update(m)
        self.streams.retain(
            {i.address for i in self.view.instances(common_pb2.CONTROL_KIND_CLUSTERMGR)}
        )
        self._fetched = True
        self._membership_due = loop.time() + self.membership_refresh_s

    async def _beat(self, st: _NodeState) -> str | None:
        """Register or heartbeat one node; returns an error text on failure."""
        loop = asyncio.get_running_loop()
        owner = self.view.owner(common_pb2.CONTROL_KIND_CLUSTERMGR, st.node_id)
        try:
            if owner is None:
                raise LookupError("no ClusterMgr instance in the membership yet")
            if owner.address != st.owner_address:
                # A new owner has never heard of this node.
                st.owner_address = owner.address
                st.registered = False
            phase = 1.0
            async with self.pool.stub(owner.address, clustermgr_pb2_grpc.ClusterMgrStub) as stub:
                if st.registered:
                    reply = await self.streams.update(
                        owner.address, stub, self._status_of(st.node_id)
                    )
                    st.registered = not reply.reregister
                    if reply.wrong_owner:
                        raise LookupError(f"{owner.id} no longer manages {st.node_id}")
                if not st.registered:
                    reply = await stub.RegisterNode(
                        self._status_of(st.node_id), timeout=self.rpc_timeout_s
                    )
                    if reply.wrong_owner:
                        # Stale membership: the error path refetches it.
                        st.registered = False
                        raise LookupError(f"{owner.id} does not manage {st.node_id}")
                    newly = not st.event.is_set()
                    phase = st.phase
                    st.registered = True
                    st.event.set()
                    if newly and all(s.event.is_set() for s in self._nodes.values()):
                        self.registered.set()
        except Exception as e:
            st.failures += 1
            st.next_due = loop.time() + self._backoff(st.failures)
            self._want_membership()
            return _describe(e)
        st.failures = 0
        interval_s = (reply.heartbeat_interval_ms or self.heartbeat_interval_ms) / 1000
        self._interval_s = interval_s
        st.next_due = 0.0 if st.again else loop.time() + interval_s * phase
        st.again = False
        return None

    def _log_failures(self, batch: list[_NodeState], errors: list[str | None]) -> None:
        # One line per batch and only on a node's first failure in a row, so a
        # dead ClusterMgr does not produce a log line per node per retry.
        first = [(s, e) for s, e in zip(batch, errors, strict=True) if e and s.failures == 1]
        if first:
            s, e = first[0]
            log.warning(
                "heartbeat failed for %d node(s), e.g. %s -> %s: %s (retrying)",
                len(first),
                s.node_id,
                s.owner_address or "?",
                e,
            )
