"""CreateInstance calls that give up when their node is lost: the actions
``create_watch.CreateWatch`` decides (probe the agent, give the create up),
performed with ``AgentCalls`` and Probe RPCs. Schedule and Dispatch (creates
from capacity credits) send their creates through one ``WatchedCreates``
each and tell it when ClusterMgr declares a node dead."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from controlplane.runtime import create_watch
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.rpc import ChannelPool
from galaxy.v1 import nodeagent_pb2, nodeagent_pb2_grpc

log = logging.getLogger(__name__)


class NodeLost(Exception):
    """A create given up: its node was declared dead (``reason``
    ``NODE_DEAD``) or its agent did not answer a probe (``NO_ANSWER``).
    The instance may yet start there: stop it, and place it elsewhere."""

    def __init__(self, node_id: str, reason: str) -> None:
        super().__init__(f"node {node_id}: {reason}")
        self.node_id = node_id
        self.reason = reason


class WatchedCreates:
    """CreateInstance through ``agents``, given up when its node is lost.

    pool: the process's ChannelPool, read at each probe (a component
    rebinds it). check_s, probe_timeout_s, patience_s: ``create_watch``'s."""

    def __init__(
        self,
        agents: AgentCalls,
        pool: Callable[[], ChannelPool],
        clock: Clock | None = None,
        check_s: float = create_watch.CHECK_S,
        probe_timeout_s: float = create_watch.PROBE_TIMEOUT_S,
        patience_s: float | None = None,
    ) -> None:
        self.agents = agents
        self._pool = pool
        self.clock = clock or MonotonicClock()
        self.watch: create_watch.CreateWatch[int] = create_watch.CreateWatch(
            self.clock, check_s, probe_timeout_s, patience_s
        )
        self.check_s = check_s
        self._ids = itertools.count()
        # A future per create in flight: set to NodeLost when it is given up.
        self._lost: dict[int, asyncio.Future[NodeLost]] = {}
        self._probes: set[asyncio.Task[None]] = set()

    async def create(
        self,
        node_id: str,
        address: str,
        req: nodeagent_pb2.CreateInstanceRequest,
        timeout_s: float,
    ) -> nodeagent_pb2.CreateInstanceReply:
        """``AgentCalls.create``; raises its ``grpc.aio.AioRpcError``, or
        ``NodeLost`` when the create is given up (the call is cancelled).
        ``timeout_s`` (the runtime's startup timeout and a margin) is also
        how long a probe of the node may wait for a late answer."""
        key = next(self._ids)
        lost: asyncio.Future[NodeLost] = asyncio.get_running_loop().create_future()
        self._lost[key] = lost
        self.watch.begin(key, node_id, timeout_s)
        call = asyncio.ensure_future(self.agents.create(address, req, timeout_s))
        either: set[asyncio.Future[Any]] = {call, lost}
        try:
            while True:
                await asyncio.wait(either, timeout=self.check_s, return_when="FIRST_COMPLETED")
                if call.done():
                    reply = call.result()  # raises the call's error
                    self.watch.heard(node_id)
                    return reply
                if lost.done():
                    raise lost.result()
                probe = self.watch.probe_due(key)
                if probe is not None:
                    self._spawn_probe(probe, address)
        finally:
            self.watch.end(key)
            self._lost.pop(key, None)
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await call

    def node_dead(self, node_id: str) -> int:
        """ClusterMgr declared ``node_id`` dead: its creates give up now;
        returns how many."""
        return self._give_up(node_id, self.watch.node_dead(node_id), create_watch.NODE_DEAD)

    def _give_up(self, node_id: str, keys: list[int], reason: str) -> int:
        for key in keys:
            fut = self._lost.get(key)
            if fut is not None and not fut.done():
                fut.set_result(NodeLost(node_id, reason))
        return len(keys)

    def _spawn_probe(self, node_id: str, address: str) -> None:
        task = asyncio.create_task(self._probe(node_id, address))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, node_id: str, address: str) -> None:
        deadline_s = self.watch.probe_deadline_s(node_id)
        t0 = self.clock.now()
        answered = False
        try:
            async with self._pool().stub(address, nodeagent_pb2_grpc.NodeAgentStub) as stub:
                await stub.Probe(nodeagent_pb2.ProbeRequest(node_id=node_id), timeout=deadline_s)
            answered = True
        except grpc.aio.AioRpcError as e:
            # NOT_FOUND (the agent no longer serves the node) is an answer
            # too: the create itself will say so.
            answered = e.code() not in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
            )
        except asyncio.CancelledError:
            self.watch.probed(node_id, 0.0)  # closing: decide nothing
            raise
        except Exception as e:  # e.g. an unusable address: the create fails there too
            log.warning("probe of node %s at %s failed: %r", node_id, address, e)
        took_s = self.clock.now() - t0 if answered else None
        if self.watch.verdict(took_s) is create_watch.Verdict.LATE:
            log.info(
                "node %s's agent at %s answered a probe late (%.1fs): its creates wait on",
                node_id, address, took_s,
            )  # fmt: skip
        lost = self.watch.probed(node_id, took_s)
        if lost:
            log.warning(
                "node %s's agent at %s did not answer a probe within %.1fs: "
                "giving up %d creates there",
                node_id, address, deadline_s, len(lost),
            )  # fmt: skip
            self._give_up(node_id, lost, create_watch.NO_ANSWER)

    async def close(self) -> None:
        """Cancel the probes in flight."""
        for t in list(self._probes):
            t.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
