"""One ``RpcConfig`` for servers and channels: its message size limit and
deadline reach a real server and a real pool."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.runtime import rpc
from controlplane.runtime.config import RpcConfig


async def _check(server_cfg: RpcConfig, pool_cfg: RpcConfig, name_len: int) -> grpc.StatusCode:
    server, port, _ = rpc.create_server("127.0.0.1:0", [], config=server_cfg)
    await server.start()
    pool = rpc.ChannelPool.of(pool_cfg)
    try:
        async with pool.stub(f"127.0.0.1:{port}", health_pb2_grpc.HealthStub) as s:
            await s.Check(health_pb2.HealthCheckRequest(service="x" * name_len))
    except grpc.aio.AioRpcError as e:
        return e.code()
    finally:
        await pool.close()
        await server.stop(None)
    return grpc.StatusCode.OK


async def test_the_servers_size_limit_comes_from_its_config() -> None:
    small = RpcConfig(max_message_bytes=4096)
    # An unknown service name: NOT_FOUND, once the request is read at all.
    assert await _check(RpcConfig(), RpcConfig(), 10_000) == grpc.StatusCode.NOT_FOUND
    assert await _check(small, RpcConfig(), 10_000) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await _check(small, RpcConfig(), 100) == grpc.StatusCode.NOT_FOUND


async def test_the_channels_size_limit_comes_from_its_config() -> None:
    small = RpcConfig(max_message_bytes=4096)
    assert await _check(RpcConfig(), small, 10_000) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_pool_takes_cache_and_deadline_from_its_config() -> None:
    pool = rpc.ChannelPool.of(RpcConfig(connection_cache=False, deadline_s=1.5))
    assert (pool.enabled, pool.timeout) == (False, 1.5)
    assert rpc.DEFAULT_TIMEOUT_S == RpcConfig().deadline_s
    with pytest.raises(ValueError, match="--max-message-bytes"):
        from controlplane.runtime.config import build

        build(RpcConfig, max_message_bytes=10)
