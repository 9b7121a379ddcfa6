"""NodeAgent.InstanceStream is authorized as CreateInstance: over mutual TLS
a node agent guarded as ``host.serve`` guards it (authz.allowed) lets a
component certificate open the stream and refuses a client certificate,
for the stream exactly as for the unary call. Real sockets, real certs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import SERVICE_NAME, NodeAgentServicer
from controlplane.runtime import authz, rpc, tls
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc


@pytest.fixture
async def agent(certs: Path) -> AsyncIterator[tuple[str, NodeAgentServicer]]:
    servicer = NodeAgentServicer([("node-0", Res(1000, 1000, 0))], EmulatedBackend())
    add = nodeagent_pb2_grpc.add_NodeAgentServicer_to_server
    cfg = RpcConfig(tls=tls.TlsConfig.for_identity(certs, "nodeagent"))
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(add, servicer, SERVICE_NAME)], config=cfg,
        interceptors=[tls.IdentityInterceptor(authz.allowed)],
    )  # fmt: skip
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)
        await servicer.close()


def _req(iid: str) -> nodeagent_pb2.CreateInstanceRequest:
    spec = common_pb2.FunctionSpec(name="f", command=["x"])
    return nodeagent_pb2.CreateInstanceRequest(node_id="node-0", instance_id=iid, function=spec)


def test_the_stream_is_internal() -> None:
    method = "/galaxy.v1.NodeAgent/InstanceStream"
    assert not authz.allowed(method, tls.ADMIN)
    assert authz.allowed(method, "dispatch") and authz.allowed(method, "schedule")


async def _create_as(certs: Path, identity: str, address: str, iid: str) -> object:
    pool = rpc.ChannelPool(RpcConfig(tls=tls.TlsConfig.for_identity(certs, identity)))
    calls = AgentCalls(lambda: pool)
    try:
        return await calls.create(address, _req(iid), 5.0)
    except grpc.aio.AioRpcError as e:
        return e
    finally:
        assert calls.sent["stream"] == 1  # it went to the stream first
        await calls.close()
        await pool.close()


async def test_a_component_streams_and_a_client_certificate_is_refused(certs, agent) -> None:
    address, servicer = agent
    ok = await _create_as(certs, "dispatch", address, "by-dispatch")
    assert isinstance(ok, nodeagent_pb2.CreateInstanceReply)
    assert ok.instance.instance_id == "by-dispatch"
    refused = await _create_as(certs, tls.ADMIN, address, "by-admin")
    assert isinstance(refused, grpc.aio.AioRpcError)
    # The unary call's refusal, not a broken stream (which would be retried).
    try:
        await _unary_as(certs, tls.ADMIN, address, "by-admin")
        raise AssertionError("the unary call was allowed")
    except grpc.aio.AioRpcError as e:
        want = (e.code(), e.details())
    assert want[0] == grpc.StatusCode.PERMISSION_DENIED
    assert (refused.code(), refused.details()) == (
        grpc.StatusCode.PERMISSION_DENIED,
        want[1].replace("CreateInstance", "InstanceStream"),
    )
    assert "by-admin" not in servicer.nodes["node-0"].instances


async def _unary_as(certs: Path, identity: str, address: str, iid: str) -> object:
    ch = rpc.insecure_channel(address, tls.TlsConfig.for_identity(certs, identity))
    try:
        return await nodeagent_pb2_grpc.NodeAgentStub(ch).CreateInstance(_req(iid), timeout=5)
    finally:
        await ch.close()
