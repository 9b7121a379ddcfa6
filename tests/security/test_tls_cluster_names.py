"""Mutual TLS where peers are dialled by addresses no certificate lists (pod
IPs): a fixed server name every component certificate carries is checked
instead; and a plaintext health-only port for probes without certificates."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.runtime import rpc, tls
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.tls import TlsConfig


async def _check(address: str, cfg: TlsConfig | None) -> int:
    async with rpc.insecure_channel(address, cfg) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return int(reply.status)


async def test_server_name_replaces_the_dialled_host(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    # Certificates name only the cluster-wide name, not 127.0.0.1.
    tls.ensure(certs, ["dispatch", "controller"], ["galaxy.internal"])
    server_cfg = TlsConfig.for_identity(certs, "dispatch")
    server, port, health_servicer = rpc.create_server(
        "127.0.0.1:0", [], config=RpcConfig(tls=server_cfg)
    )
    await server.start()
    health_only, hport = rpc.health_only_server("127.0.0.1:0", health_servicer)
    await health_only.start()
    try:
        named = TlsConfig.for_identity(certs, "controller", server_name="galaxy.internal")
        assert await _check(f"127.0.0.1:{port}", named) == health_pb2.HealthCheckResponse.SERVING
        # Without the name, the dialled IP is checked and is not in the certificate.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _check(f"127.0.0.1:{port}", TlsConfig.for_identity(certs, "controller"))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        # A certificate from another CA is refused even with the right name.
        other = tmp_path / "other"
        tls.ensure(other, ["controller"], ["galaxy.internal"])
        foreign = TlsConfig.for_identity(other, "controller", server_name="galaxy.internal")
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(f"127.0.0.1:{port}", foreign)
        # The main port refuses plaintext; the health-only port answers it.
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(f"127.0.0.1:{port}", None)
        assert await _check(f"127.0.0.1:{hport}", None) == health_pb2.HealthCheckResponse.SERVING
        async with rpc.insecure_channel(f"127.0.0.1:{hport}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ch.unary_unary("/galaxy.v1.Dispatch/Dispatch")(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED  # nothing else there
    finally:
        await health_only.stop(0)
        await server.stop(0)
