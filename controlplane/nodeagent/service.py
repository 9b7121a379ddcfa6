"""NodeAgent gRPC service: runs function instances on one or many nodes.

One servicer hosts a node pool (one node on a real worker, hundreds in an
emulated cluster); the request's node_id selects the node. Capacity policy is
in ``capacity.NodeCapacity``, running instances in a ``sandbox`` backend; this
module is the adapter between them and the API.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

import grpc

from controlplane.nodeagent import instance_stream
from controlplane.nodeagent.capacity import NodeCapacity, Res
from controlplane.nodeagent.modelcache import ModelCache, release_quietly
from controlplane.nodeagent.modelindex import Entry
from controlplane.nodeagent.sandbox import Sandbox, SandboxBackend, describe_exit
from controlplane.runtime import models, rpc
from controlplane.runtime.errors import (
    FailedPrecondition,
    GalaxyError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from controlplane.runtime.metrics import (
    NODEAGENT_INSTANCES,
    NODEAGENT_LAUNCH_WAITING,
    NODEAGENT_PENDING,
    NODEAGENT_REJECTED,
)
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc, nodeagent_pb2, nodeagent_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgent"].full_name

# Deadline of the best-effort ModInstance sent when an instance exits.
_NOTIFY_TIMEOUT_S = 5.0
#: Instances starting at once on one agent (its whole pool) by default.
DEFAULT_MAX_STARTING = 10_000


@dataclass(eq=False)
class _Instance:
    """Bookkeeping of one instance from CreateInstance to its end."""

    instance_id: str
    spec: common_pb2.FunctionSpec
    notify_address: str
    start: asyncio.Task[None] | None = None
    sandbox: Sandbox | None = None
    info: common_pb2.InstanceInfo | None = None
    startup_ms: float = 0.0
    #: event-loop time it became ready (0: not yet)
    ready_at: float = 0.0
    #: the node's seq when it became ready (CreateInstanceReply.node_seq)
    ready_seq: int = 0
    #: the model cache entry it pinned (released when it ends)
    model: Entry | None = None


@dataclass(eq=False)
class Node:
    """One node of the pool: its capacity ledger and instances."""

    node_id: str
    capacity: NodeCapacity
    #: host:port of the agent serving this node (NodeStatus.address).
    address: str = ""
    # Starts at wall-clock microseconds so a restarted agent's first status
    # outranks whatever its previous life last sent (receivers drop lower seq).
    seq: int = field(default_factory=lambda: time.time_ns() // 1000)
    #: This life of the agent (NodeStatus.incarnation): its first seq, so it
    #: differs from every earlier life's without another clock read.
    incarnation: int = 0
    instances: dict[str, _Instance] = field(default_factory=dict)
    #: models in the agent's cache, reported to placement with each status
    held_models: Callable[[], list[common_pb2.ModelHeld]] = list

    def status(self, *, bump: bool = False) -> common_pb2.NodeStatus:
        """Current NodeStatus; bump=True first advances seq (one per send)."""
        if bump:
            self.seq += 1
        starting = Res()
        for inst in self.instances.values():
            if inst.info is None:
                starting = starting + Res.from_proto(inst.spec.resources)
        return common_pb2.NodeStatus(
            node_id=self.node_id,
            address=self.address,
            capacity=self.capacity.capacity.to_proto(),
            allocated=self.capacity.allocated.to_proto(),
            instances=len(self.instances),
            seq=self.seq,
            starting=starting.to_proto(),
            models=self.held_models(),
            incarnation=self.incarnation,
        )

    def __post_init__(self) -> None:
        if not self.incarnation:
            self.incarnation = self.seq


class NodeAgentServicer(nodeagent_pb2_grpc.NodeAgentServicer):
    """The NodeAgent API over a pool of nodes sharing one sandbox backend.

    nodes: (node_id, capacity) pairs. pool: the ChannelPool for exit
    notifications to Dispatch (``attach`` may supply it later). on_freed:
    called with a node id when an instance's capacity is freed there (the
    agent reports the node's status at once: see ``Registrar.report_soon``).
    max_starting: instances starting at once over the pool; a new
    CreateInstance beyond is refused with RESOURCE_EXHAUSTED (Schedule then
    tries another node). max_launching: of those, how many sandboxes are
    launched and awaited at once (0: one per CPU this agent may use); the
    others wait their turn, bounded by max_starting.
    """

    def __init__(
        self,
        nodes: Iterable[tuple[str, Res]],
        backend: SandboxBackend,
        pool: rpc.ChannelPool | None = None,
        address: str = "",
        max_starting: int = DEFAULT_MAX_STARTING,
        models: ModelCache | None = None,
        max_launching: int = 0,
    ) -> None:
        if max_starting < 1:
            raise ValueError("max_starting must be >= 1")
        if max_launching < 0:
            raise ValueError("max_launching must be >= 0")
        self.max_starting = max_starting
        self.starting = 0
        # Starts that share a node's CPUs all at once are all late together:
        # 13 process sandboxes launched at once on 2 cores each took 10.9-13.2 s
        # to answer (their startup timeout was 10 s, so every one failed and
        # was made again, for ever), two at a time 1.2-2.6 s each
        # (docs/reliability.md, "The agent kill under load"). Code-running
        # backends launch at most this many at once; an emulated one has no
        # code to run.
        self.max_launching = max_launching or len(os.sched_getaffinity(0))
        self._launches = (
            asyncio.Semaphore(self.max_launching) if getattr(backend, "needs_command", False)
            else None
        )  # fmt: skip
        self.backend = backend
        self.pool = pool
        self.nodes: dict[str, Node] = {}
        for node_id, cap in nodes:
            if not node_id:
                raise ValueError("node ids must be non-empty")
            if node_id in self.nodes:
                raise ValueError(f"duplicate node id {node_id}")
            self.nodes[node_id] = Node(node_id, NodeCapacity(cap, node_id), address)
        #: The node's model cache (None: specs with a model are refused).
        self.models = models
        if models is not None:
            for node in self.nodes.values():
                node.held_models = models.held
        self._ready_count = 0
        self._background: set[asyncio.Task[None]] = set()
        self.on_freed: Callable[[str], None] = lambda node_id: None

    def attach(self, address: str, pool: rpc.ChannelPool | None = None) -> None:
        """Record the agent's serving address (and channel pool) once bound."""
        for node in self.nodes.values():
            node.address = address
        if pool is not None:
            self.pool = pool

    def node(self, node_id: str) -> Node:
        """The node with that id, or NotFound."""
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(f"node {short(node_id)} is not served by this node agent")
        return node

    def heartbeat_status(self, node_id: str) -> common_pb2.NodeStatus:
        """The node's status with a fresh seq, for registration/heartbeats."""
        return self.node(node_id).status(bump=True)

    # --- API ---------------------------------------------------------------

    async def CreateInstance(
        self, request: nodeagent_pb2.CreateInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.CreateInstanceReply:
        """Start an instance and answer once it is ready; idempotent for
        (node_id, instance_id): a repeat awaits the same start."""
        self._validate(request)
        node = self.node(request.node_id)
        inst = node.instances.get(request.instance_id)
        if inst is None:
            if self.starting >= self.max_starting:  # a retry below joins, never shed
                NODEAGENT_REJECTED.labels("queue_full").inc()
                raise ResourceExhausted(
                    f"node agent has {self.starting} instances starting "
                    f"(max_starting {self.max_starting}); try another node"
                )
            req = Res.from_proto(request.function.resources)
            node.capacity.allocate(request.instance_id, req)  # ResourceExhausted if full
            inst = _Instance(request.instance_id, request.function, request.notify_address)
            node.instances[inst.instance_id] = inst
            node.seq += 1
            inst.start = asyncio.create_task(self._start(node, inst))
            self.starting += 1
            NODEAGENT_PENDING.inc()
            inst.start.add_done_callback(self._started)
        elif inst.spec.name != request.function.name:
            raise InvalidArgument(
                f"instance_id {inst.instance_id} is already used on node {node.node_id} "
                f"by function {inst.spec.name}"
            )
        assert inst.start is not None
        try:
            # Shielded: a caller that gives up does not abort the start, so a
            # retry with the same instance_id finds it starting or ready.
            await asyncio.shield(inst.start)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise
            raise Unavailable(
                f"instance {inst.instance_id} was deleted while it was starting"
            ) from None
        assert inst.info is not None
        return nodeagent_pb2.CreateInstanceReply(
            instance=inst.info, startup_ms=inst.startup_ms, node_seq=inst.ready_seq
        )

    async def DeleteInstance(
        self, request: nodeagent_pb2.DeleteInstanceRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.DeleteInstanceReply:
        """Stop an instance (starting or ready) and free its resources; idempotent."""
        if not request.instance_id:
            raise InvalidArgument("instance_id must be set")
        node = self.node(request.node_id)
        inst = self._forget(node, request.instance_id)
        if inst is None:
            return nodeagent_pb2.DeleteInstanceReply(deleted=False)
        await self._end(inst)
        return nodeagent_pb2.DeleteInstanceReply(deleted=True)

    async def InstanceStream(
        self,
        request_iterator: AsyncIterator[nodeagent_pb2.InstanceStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[nodeagent_pb2.InstanceStreamReply]:
        """CreateInstance and DeleteInstance as messages on one stream
        (``controlplane.nodeagent.instance_stream``)."""
        async for reply in instance_stream.serve(self, request_iterator, context):
            yield reply

    async def Probe(
        self, request: nodeagent_pb2.ProbeRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.ProbeReply:
        """The node's current status (capacity, allocation, instance count, seq)."""
        return nodeagent_pb2.ProbeReply(status=self.node(request.node_id).status())

    async def ListNodeInstances(
        self, request: nodeagent_pb2.ListNodeInstancesRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.ListNodeInstancesReply:
        """Ready instances of the node (starting ones have no address yet)."""
        node = self.node(request.node_id)
        infos = [i.info for i in node.instances.values() if i.info is not None]
        return nodeagent_pb2.ListNodeInstancesReply(instances=infos)

    async def WarmModel(
        self, request: nodeagent_pb2.WarmModelRequest, context: grpc.aio.ServicerContext
    ) -> nodeagent_pb2.WarmModelReply:
        """Fetch a model into the node's cache now (``ModelCache.warm``)."""
        self.node(request.node_id)
        if not request.HasField("model"):
            raise InvalidArgument("model: required")
        models.check(request.model)
        if self.models is None:
            raise FailedPrecondition("this node agent has no model cache (--model-cache-dir)")
        return await self.models.warm(request.model)

    # --- lifecycle -----------------------------------------------------------

    def ready_instances(self) -> dict[str, tuple[str, str, float]]:
        """Ready instances: id -> (node id, function, when it became ready)."""
        return {
            i.instance_id: (node.node_id, i.spec.name, i.ready_at)
            for node in self.nodes.values()
            for i in node.instances.values()
            if i.sandbox is not None
        }

    async def stop_instance(self, node_id: str, instance_id: str) -> bool:
        """Stop one instance and free its resources (the orphan reaper's
        DeleteInstance); False if it was gone already."""
        inst = self._forget(self.node(node_id), instance_id)
        if inst is None:
            return False
        await self._end(inst)
        return True

    async def close(self) -> None:
        """Stop every instance on every node, then the backend."""
        insts = [
            inst
            for node in self.nodes.values()
            for iid in list(node.instances)
            if (inst := self._forget(node, iid)) is not None
        ]
        await asyncio.gather(*(self._end(i) for i in insts))
        await self.backend.close()
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # --- internals -----------------------------------------------------------

    def _started(self, task: asyncio.Task[None]) -> None:
        self.starting -= 1
        NODEAGENT_PENDING.dec()
        # Retrieve the outcome even if every caller has gone (deadline).
        if not task.cancelled():
            task.exception()

    def _validate(self, request: nodeagent_pb2.CreateInstanceRequest) -> None:
        if not request.instance_id:
            raise InvalidArgument("instance_id must be set")
        if not request.node_id:
            raise InvalidArgument("node_id must be set")
        fn = request.function
        if not fn.name:
            raise InvalidArgument("function.name must be set")
        if self.backend.needs_command and not fn.command:
            raise InvalidArgument(
                f"function.command must not be empty: the {self.backend.kind} sandbox runs it"
            )
        if fn.workdir and not os.path.isabs(fn.workdir):
            raise InvalidArgument(
                f"function.workdir must be an absolute path, got {short(fn.workdir)}"
            )

    async def _start(self, node: Node, inst: _Instance) -> None:
        t0 = time.perf_counter()

        def on_exit(instance_id: str, returncode: int) -> None:
            self._exited(node, inst, returncode)

        try:
            spec = await self._with_model(inst)
            if self._launches is None:
                sb = await self.backend.start(node.node_id, inst.instance_id, spec, on_exit)
            else:
                NODEAGENT_LAUNCH_WAITING.inc()
                try:
                    await self._launches.acquire()
                finally:
                    NODEAGENT_LAUNCH_WAITING.dec()
                try:
                    sb = await self.backend.start(node.node_id, inst.instance_id, spec, on_exit)
                finally:
                    self._launches.release()
        except Exception as e:
            self._forget(node, inst.instance_id, only=inst)
            if isinstance(e, GalaxyError):
                raise
            log.exception("sandbox start failed for instance %s", inst.instance_id)
            raise Unavailable(f"instance {inst.instance_id} failed to start: {e}") from e
        except BaseException:  # cancelled (deleted while starting)
            self._forget(node, inst.instance_id, only=inst)
            raise
        inst.sandbox = sb
        # Statuses from now on count it as allocated, not starting.
        node.seq += 1
        inst.ready_seq = node.seq
        inst.startup_ms = (time.perf_counter() - t0) * 1000
        inst.ready_at = asyncio.get_running_loop().time()
        inst.info = common_pb2.InstanceInfo(
            instance_id=inst.instance_id,
            function=inst.spec.name,
            node_id=node.node_id,
            address=sb.address,
            spec_version=inst.spec.version,
            concurrency=inst.spec.concurrency,
        )
        self._ready_count += 1
        NODEAGENT_INSTANCES.set(self._ready_count)

    async def _with_model(self, inst: _Instance) -> common_pb2.FunctionSpec:
        """The spec to start: with a model, its local path in the command
        ({model}) and in $GALAXY_MODEL_PATH, the cache entry pinned."""
        spec = inst.spec
        if not spec.HasField("model"):
            return spec
        if self.models is None:
            raise FailedPrecondition(
                f"function {spec.name} names a model and this node agent has no model cache "
                "(--model-cache-dir)"
            )
        path, inst.model = await self.models.acquire(spec.model)
        out = common_pb2.FunctionSpec()
        out.CopyFrom(spec)
        out.command[:] = models.command_with_model(list(spec.command), str(path))
        out.env[models.ENV_PATH] = str(path)
        return out

    def _forget(
        self, node: Node, instance_id: str, only: _Instance | None = None
    ) -> _Instance | None:
        """Drop an instance from the books and free its capacity at once.

        Freeing before the sandbox has stopped keeps the ledger consistent with
        ``instances`` (a new CreateInstance with the same id must allocate
        again); the overlap with a dying process is at most the stop grace.
        only: forget it only if the entry is still that object.
        """
        inst = node.instances.get(instance_id)
        if inst is None or (only is not None and inst is not only):
            return None
        del node.instances[instance_id]
        release_quietly(self.models, inst.model)
        inst.model = None
        node.capacity.free(instance_id)
        node.seq += 1
        self.on_freed(node.node_id)
        if inst.info is not None:
            self._ready_count -= 1
            NODEAGENT_INSTANCES.set(self._ready_count)
        return inst

    async def _end(self, inst: _Instance) -> None:
        """Stop a forgotten instance, whether still starting or ready."""
        if inst.start is not None and not inst.start.done():
            inst.start.cancel()  # the backend leaves nothing running when cancelled
            await asyncio.wait({inst.start})
        if inst.sandbox is not None:
            await inst.sandbox.stop()

    def _exited(self, node: Node, inst: _Instance, returncode: int) -> None:
        if self._forget(node, inst.instance_id, only=inst) is None:
            return  # already deleted
        sb = inst.sandbox
        reason = sb.exit_reason(returncode) if sb is not None else describe_exit(returncode)
        if sb is not None and sb.killed_for:
            reason += f"; {sb.killed_for}"
        log.warning("instance %s on node %s ended: %s", inst.instance_id, node.node_id, reason)
        if inst.notify_address and inst.info is not None:
            task = asyncio.create_task(self._notify(inst.notify_address, inst.info, reason))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _notify(self, address: str, info: common_pb2.InstanceInfo, reason: str) -> None:
        req = dispatch_pb2.ModInstanceRequest(
            op=dispatch_pb2.ModInstanceRequest.OP_REMOVE, instance=info, reason=reason
        )
        pool = self.pool or rpc.ChannelPool()
        try:
            async with pool.stub(address, dispatch_pb2_grpc.DispatchStub) as stub:
                await stub.ModInstance(req, timeout=_NOTIFY_TIMEOUT_S)
        except Exception as e:  # best effort: Dispatch also learns on its next failed call
            log.warning(
                "could not tell dispatch %s that instance %s ended: %s",
                address,
                info.instance_id,
                e,
            )
        finally:
            if pool is not self.pool:
                await pool.close()
