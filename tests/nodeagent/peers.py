"""The node agent's peers in its tests are the real Controller, ClusterMgr,
Schedule and Dispatch, run in-process by ``tests.cluster.InProcessCluster``
(real components built from their `galaxy serve` flags, served by the real
host over loopback gRPC). This module adds what the node agent tests need on
top: starting a component on a chosen address, and reading what a ClusterMgr
knows about nodes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import grpc

from controlplane.runtime import rpc
from controlplane.runtime.membership import MembershipView
from functions.clustermgr.policy import NodeRecord, NodeRegistry
from functions.clustermgr.service import SERVICE_NAME, ClusterMgrServicer
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
)
from tests.cluster import InProcessCluster, Running, eventually

#: ClusterMgr flags for these tests: it asks for a heartbeat every 20 ms, so
#: a test sees several within a fraction of a second, and declares a node
#: dead only after a minute, so a busy machine never makes one flap.
CLUSTERMGR_FLAGS = ("--heartbeat-ms", "20", "--dead-after-ms", "60000")


class Peers(InProcessCluster):
    """An ``InProcessCluster`` that can also start a component on a chosen
    address: a controller that comes up late at the address the node agent
    was given, a ClusterMgr restarted where it was."""

    async def clustermgr(self, instance_id: str) -> Running:
        """Start a ClusterMgr with ``CLUSTERMGR_FLAGS``."""
        return await self.add("clustermgr", instance_id, *CLUSTERMGR_FLAGS)

    async def add_at(self, listen: str, kind: str, instance_id: str, *flags: str) -> Running:
        """``add``, listening on listen (host:port) instead of a free port."""
        return await self.add(kind, instance_id, *flags, listen=listen)


def known(cm: Running) -> dict[str, NodeRecord]:
    """The nodes a ClusterMgr's NodeRegistry holds, by node id."""
    return {r.status.node_id: r for r in cm.component.registry.records()}


async def list_nodes(pool: rpc.ChannelPool, cm: Running) -> dict[str, clustermgr_pb2.ClusterNode]:
    """The nodes a ClusterMgr reports through its ListNodes RPC, by node id."""
    async with pool.stub(cm.address, clustermgr_pb2_grpc.ClusterMgrStub) as stub:
        reply = await stub.ListNodes(clustermgr_pb2.ListClusterNodesRequest(), timeout=5)
    return {n.status.node_id: n for n in reply.nodes}


async def owners(pool: rpc.ChannelPool, controller: str, node_ids: Iterable[str]) -> dict[str, str]:
    """node id -> id of the ClusterMgr owning it (rendezvous hashing) under
    the controller's current membership, as the node agent must compute it."""
    async with pool.stub(controller, controller_pb2_grpc.ControllerStub) as stub:
        m = await stub.GetMembership(controller_pb2.GetMembershipRequest(), timeout=5)
    view = MembershipView()
    view.update(m)
    out = {}
    for n in node_ids:
        o = view.owner(common_pb2.CONTROL_KIND_CLUSTERMGR, n)
        assert o is not None, "no ClusterMgr in the membership"
        out[n] = o.id
    return out


async def heartbeats(cm: Running, node_ids: Iterable[str], count: int) -> None:
    """Wait until the ClusterMgr has recorded `count` successively newer
    statuses (strictly higher seq) of every node in node_ids, counting from
    what it holds now: each is an RPC from the agent that it received and
    accepted. A node it does not hold yet counts from its first status."""
    last: dict[str, int] = {}
    seen: dict[str, int] = {n: 0 for n in node_ids}

    def counted() -> bool:
        records = known(cm)
        for n in seen:
            rec = records.get(n)
            if rec is None:
                continue
            if n in last and rec.status.seq > last[n]:
                seen[n] += 1
            last[n] = max(last.get(n, 0), rec.status.seq)
        return min(seen.values()) >= count

    await eventually(counted, what=f"{count} heartbeats of each node at {cm.name}")


async def grpcurl(address: str, method: str, messages: Iterable[dict[str, Any]]) -> list[Any]:
    """Send messages (JSON) on method ("galaxy.v1.Service/Method") with
    grpcurl over plaintext; the replies it printed, in order. Asserts that
    grpcurl exited 0 (subprocess.run kills it after its timeout)."""
    out = await asyncio.to_thread(
        subprocess.run,
        ["grpcurl", "-plaintext", "-d", "@", address, method],
        input="\n".join(json.dumps(m) for m in messages), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    decoder, text, replies = json.JSONDecoder(), out.stdout.strip(), []
    while text:
        obj, end = decoder.raw_decode(text)
        replies.append(obj)
        text = text[end:].strip()
    return replies


class OldClusterMgr:
    """A ClusterMgr of an older version: a real ClusterMgrServicer served
    with only some of its methods (the others answer UNIMPLEMENTED), and
    registered with the controller as instance ``cm-old``. ``stop()`` it."""

    def __init__(self, methods: Iterable[str]) -> None:
        self.registry = NodeRegistry(dead_after_s=60.0)
        self.servicer = ClusterMgrServicer(self.registry, heartbeat_s=0.02)
        #: As a Running for ``heartbeats``.
        self.running = SimpleNamespace(
            component=SimpleNamespace(registry=self.registry), name="old"
        )
        self._methods = list(methods)
        self.address = ""
        self._server: grpc.aio.Server | None = None

    def _handler(self, name: str) -> grpc.RpcMethodHandler:
        status = common_pb2.NodeStatus.FromString
        if name == "Heartbeats":
            return grpc.stream_stream_rpc_method_handler(
                self.servicer.Heartbeats,
                request_deserializer=status,
                response_serializer=clustermgr_pb2.HeartbeatReply.SerializeToString,
            )
        return grpc.unary_unary_rpc_method_handler(
            getattr(self.servicer, name),
            request_deserializer=status,
            response_serializer=clustermgr_pb2.UpdateReply.SerializeToString,
        )

    async def start(self, pool: rpc.ChannelPool, controller: str) -> None:
        handlers = {name: self._handler(name) for name in self._methods}

        def add(_servicer: object, server: grpc.aio.Server) -> None:
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
            )

        self._server, port, _ = rpc.create_server(
            "127.0.0.1:0", [(add, self.servicer, SERVICE_NAME)]
        )
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        async with pool.stub(controller, controller_pb2_grpc.ControllerStub) as ctl:
            await ctl.RegisterInstance(
                common_pb2.ControlInstance(
                    id="cm-old", kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=self.address
                ),
                timeout=5,
            )

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
