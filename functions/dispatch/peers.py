"""Dispatch's calls to other components: placing instances through Schedule
(with spill), deleting them on node agents, handing them to another Dispatch
instance, checking which still run. I/O only; the routing state stays in the
servicer and its FunctionRouter policies.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from controlplane.runtime import controllers, metrics, rpc
from controlplane.runtime.errors import (
    FailedPrecondition,
    GalaxyError,
    ResourceExhausted,
    Unavailable,
)
from controlplane.runtime.validation import short
from functions.dispatch.config import DEFAULTS
from galaxy.v1 import (
    common_pb2,
    dispatch_pb2,
    dispatch_pb2_grpc,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)

log = logging.getLogger(__name__)

# Slack on top of a function's startup timeout for the Schedule call, which
# answers only when the instance is ready.
SCHEDULE_SLACK_S = 5.0


#: Outcomes of a Schedule call after which the next Schedule instance is
#: tried. Not DEADLINE_EXCEEDED: that placement may still be under way.
SPILL_ON = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})


class Peers:
    """Outbound RPCs of one Dispatch instance."""

    def __init__(
        self, instance_id: str, pool: rpc.ChannelPool, max_spill: int = DEFAULTS.max_spill
    ) -> None:
        self.instance_id = instance_id
        self.pool = pool
        self.max_spill = max_spill
        #: this Dispatch instance's own address (node agents notify it)
        self.address = ""
        # Unreachable reports in flight, by instance id (one at a time each).
        self._reporting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def report_unreachable(self, controller: str, inst: common_pb2.ControlInstance) -> None:
        """Tell the controller inst did not answer (in the background, once
        at a time per instance; the controller checks before it acts)."""
        if inst.id in self._reporting or not controller:
            return
        self._reporting.add(inst.id)
        task = asyncio.create_task(self._report(controller, inst))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, controller: str, inst: common_pb2.ControlInstance) -> None:
        try:
            r = await controllers.call(
                self.pool, controller, "ReportUnreachable", inst, timeout_s=5.0
            )
            if r.removed:
                log.warning("dispatch %s was unreachable: the controller removed it", inst.id)
        except grpc.aio.AioRpcError as e:
            log.info("could not report %s unreachable: %s", inst.id, e.code().name)
        finally:
            self._reporting.discard(inst.id)

    async def place(
        self,
        spec: common_pb2.FunctionSpec,
        instance_id: str,
        schedulers: list[common_pb2.ControlInstance],
    ) -> common_pb2.InstanceInfo:
        """Start an instance through the first Schedule instance with room.

        schedulers is the spill order (owner first); at most 1 + max_spill
        are tried, moving on when one has no room (RESOURCE_EXHAUSTED), cannot
        be reached (UNAVAILABLE: a crashed or scaled-in instance the
        membership still lists) or says the spec is too big for its
        partition's nodes (FAILED_PRECONDITION). Raises a GalaxyError whose
        status tells the waiters what to do: FAILED_PRECONDITION only when
        every partition tried said the spec can never fit.
        """
        start = time.perf_counter()
        req = schedule_pb2.ScheduleRequest(
            instance_id=instance_id, function=spec, notify_address=self.address
        )
        reasons: list[str] = []
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        candidates = schedulers[: 1 + self.max_spill]
        never = 0
        if not candidates:
            reasons.append("no Schedule instance is registered yet")
            code = grpc.StatusCode.UNAVAILABLE
        timeout = spec.startup_timeout_ms / 1000.0 + SCHEDULE_SLACK_S
        for sched in candidates:
            try:
                async with self.pool.stub(sched.address, schedule_pb2_grpc.ScheduleStub) as s:
                    reply = await s.Schedule(req, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                reasons.append(f"schedule {sched.id}: {e.details()}")
                code = e.code()
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    never += 1  # too big for that partition; another may have larger nodes
                    continue
                if code in SPILL_ON:
                    continue  # spill to the next-highest Schedule instance
                break
            metrics.COLD_START_LATENCY.observe(time.perf_counter() - start)
            info: common_pb2.InstanceInfo = reply.instance
            return info
        if code == grpc.StatusCode.FAILED_PRECONDITION and never < len(reasons):
            code = grpc.StatusCode.RESOURCE_EXHAUSTED  # some partition may fit it later
        msg = f"cannot start an instance of {short(spec.name)}: " + "; ".join(reasons)
        log.warning(msg)
        err: GalaxyError
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            err = ResourceExhausted(msg)
        elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
            # Retrying will not help: the spec itself cannot be placed.
            err = FailedPrecondition(msg)
        else:
            err = Unavailable(msg + "; retry later")
        raise err

    async def delete_on_node(self, info: common_pb2.InstanceInfo) -> None:
        """Stop an instance on its node (best effort, logged)."""
        if not info.node_address:
            log.warning("cannot delete %s: node address unknown", info.instance_id)
            return
        try:
            async with self.pool.stub(info.node_address, nodeagent_pb2_grpc.NodeAgentStub) as s:
                await s.DeleteInstance(
                    nodeagent_pb2.DeleteInstanceRequest(
                        node_id=info.node_id, instance_id=info.instance_id
                    )
                )
        except grpc.aio.AioRpcError as e:
            log.warning("DeleteInstance %s failed: %s", info.instance_id, e.details())

    async def send_instance(
        self, owner: common_pb2.ControlInstance, info: common_pb2.InstanceInfo, leases: list[str]
    ) -> None:
        """Hand an instance (and its reserved slots) to the function's new owner."""
        req = dispatch_pb2.ModInstanceRequest(
            op=dispatch_pb2.ModInstanceRequest.OP_ADD,
            instance=info,
            reason=f"handed over by {self.instance_id}",
            active_leases=leases,
        )
        try:
            async with self.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                await s.ModInstance(req)
        except grpc.aio.AioRpcError as e:
            # The instance keeps running; the new owner does not route to it
            # until it learns of it (e.g. on its next restart, from the records).
            log.warning("handover of %s to %s failed: %s", info.instance_id, owner.id, e.details())

    async def running(
        self, records: list[common_pb2.InstanceInfo]
    ) -> tuple[list[common_pb2.InstanceInfo], list[common_pb2.InstanceInfo]]:
        """Split records into (still running, gone) by asking their node agents.

        A node that cannot be asked counts as gone for its instances: routing
        to an instance nobody can vouch for would fail requests.
        """
        by_node: dict[tuple[str, str], list[common_pb2.InstanceInfo]] = {}
        for info in records:
            by_node.setdefault((info.node_address, info.node_id), []).append(info)

        async def alive(addr: str, node: str) -> set[str]:
            if not addr:
                return set()
            try:
                async with self.pool.stub(addr, nodeagent_pb2_grpc.NodeAgentStub) as s:
                    r = await s.ListNodeInstances(
                        nodeagent_pb2.ListNodeInstancesRequest(node_id=node), timeout=2.0
                    )
                return {i.instance_id for i in r.instances}
            except grpc.aio.AioRpcError as e:
                log.warning("cannot verify instances on %s (%s): %s", node, addr, e.details())
                return set()

        keys = list(by_node)
        found = await asyncio.gather(*(alive(a, n) for a, n in keys))
        live: list[common_pb2.InstanceInfo] = []
        gone: list[common_pb2.InstanceInfo] = []
        for key, ids in zip(keys, found, strict=True):
            for info in by_node[key]:
                (live if info.instance_id in ids else gone).append(info)
        return live, gone
