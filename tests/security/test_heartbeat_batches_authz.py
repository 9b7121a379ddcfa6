"""ClusterMgr.HeartbeatBatches is authorized as Heartbeats and Update: over
mutual TLS a ClusterMgr guarded as ``host.serve`` guards it (authz.allowed)
answers a node agent's certificate and refuses a client certificate with
PERMISSION_DENIED before any status is handled. Real sockets, real certs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane.runtime import authz, rpc, tls
from controlplane.runtime.clock import ManualClock
from controlplane.runtime.config import RpcConfig
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME, ClusterMgrServicer
from galaxy.v1 import clustermgr_pb2, clustermgr_pb2_grpc, common_pb2


@pytest.fixture
async def clustermgr(certs: Path) -> AsyncIterator[tuple[str, ClusterMgrServicer]]:
    servicer = ClusterMgrServicer(NodeRegistry(clock=ManualClock()))
    add = clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server
    cfg = RpcConfig(tls=tls.TlsConfig.for_identity(certs, "clustermgr"))
    server, port, _ = rpc.create_server(
        "127.0.0.1:0", [(add, servicer, SERVICE_NAME)], config=cfg,
        interceptors=[tls.IdentityInterceptor(authz.allowed)],
    )  # fmt: skip
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)
        await servicer.stop()


def test_the_batch_stream_is_internal_as_the_other_heartbeat_methods() -> None:
    for name in ("HeartbeatBatches", "Heartbeats", "Update"):
        method = f"/galaxy.v1.ClusterMgr/{name}"
        assert not authz.allowed(method, tls.ADMIN)
        assert authz.allowed(method, "nodeagent")


async def _batch_as(certs: Path, identity: str, address: str) -> object:
    ch = rpc.insecure_channel(address, tls.TlsConfig.for_identity(certs, identity))
    try:
        call = clustermgr_pb2_grpc.ClusterMgrStub(ch).HeartbeatBatches(timeout=10)
        batch = clustermgr_pb2.NodeStatusBatch(
            statuses=[common_pb2.NodeStatus(node_id="n1", address="127.0.0.1:1", seq=1)]
        )
        await call.write(batch)
        await call.done_writing()
        return await call.read()
    except grpc.aio.AioRpcError as e:
        return e
    finally:
        await ch.close()


async def test_a_node_agent_is_answered_and_a_client_certificate_refused(certs, clustermgr) -> None:
    address, servicer = clustermgr
    ok = await _batch_as(certs, "nodeagent", address)
    assert isinstance(ok, clustermgr_pb2.HeartbeatBatchReply)
    assert [r.node_id for r in ok.replies] == ["n1"] and ok.replies[0].reply.reregister
    handled = servicer.node_updates
    refused = await _batch_as(certs, tls.ADMIN, address)
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "HeartbeatBatches" in (refused.details() or "")
    assert servicer.node_updates == handled  # the refused status was never handled
