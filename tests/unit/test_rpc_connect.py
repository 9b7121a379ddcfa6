"""A new connection to a peer that is a moment late with its handshake (a
loaded machine: the process gets no CPU for half a second) still carries
the call: Galaxy's channels and its etcd client's give a connection attempt
gRPC's default time, not 100 ms."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.runtime import procs, rpc
from statestore import etcd

#: A plain gRPC server with the health service; prints its port.
SERVER = """
import asyncio, grpc
from grpc_health.v1 import health, health_pb2_grpc
async def main():
    s = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), s)
    print(s.add_insecure_port("127.0.0.1:0"), flush=True)
    await s.start()
    await asyncio.sleep(120)
asyncio.run(main())
"""


@pytest.mark.slow  # starts a server process and stops it for 0.5 s
@pytest.mark.parametrize(
    "options",
    [rpc._CHANNEL_OPTIONS, list(etcd._CHANNEL_OPTIONS.items())],
    ids=["galaxy-channels", "etcd-client"],
)
async def test_a_peer_late_with_its_handshake_still_answers(options: list[Any]) -> None:
    server = await procs.spawn(sys.executable, "-c", SERVER, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(await asyncio.wait_for(server.stdout.readline(), 30))
        os.kill(server.pid, signal.SIGSTOP)  # no CPU for 0.5 s: no SETTINGS sent
        asyncio.get_running_loop().call_later(0.5, os.kill, server.pid, signal.SIGCONT)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=20
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.send_signal(signal.SIGCONT)
        await procs.terminate(server, grace_s=5)
