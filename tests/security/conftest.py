"""A real controller and Dispatch instance (tests/cluster.py's in-process
cluster) running on an event loop in a background thread, so synchronous
tests -- and hypothesis, which drives synchronous test functions -- can call
them over real gRPC channels."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from controlplane.runtime import tls
from galaxy.v1 import common_pb2, controller_pb2, controller_pb2_grpc, dispatch_pb2_grpc
from tests.cluster import InProcessCluster

T = TypeVar("T")

#: The runtimes every test here may name: one that admits any env (so the
#: spec rules are reached on their own) and a strict one (the runtime rules).
RUNTIMES = (
    common_pb2.ServingRuntime(name="sec", command=["python3", "server.py"], allowed_env=["*"]),
    common_pb2.ServingRuntime(
        name="strict",
        command=["python3", "-u", "{artifact}", "{args}"],
        artifact=common_pb2.ServingRuntime.ArtifactRules(
            required=True, prefixes=["/srv/functions"], suffixes=[".py"], max_length=256
        ),
        allowed_args=["--model-name", "--workers"],
        max_args=4,
        allowed_env=["APP_*", "LOG_LEVEL"],
    ),
)


class ThreadedCluster:
    """Controller + one Dispatch instance on a loop in their own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cluster = InProcessCluster()
        self.run(self.cluster.add("controller", "controller"))
        self.dispatch = self.run(self.cluster.add("dispatch", "dispatch-0")).address
        self.controller = self.cluster.controller
        # Default options on purpose: an ordinary client, 4 MiB receive limit.
        self.channels = {a: grpc.insecure_channel(a) for a in (self.controller, self.dispatch)}
        self.ctl = controller_pb2_grpc.ControllerStub(self.channels[self.controller])
        self.dsp = dispatch_pb2_grpc.DispatchStub(self.channels[self.dispatch])
        for rt in RUNTIMES:
            self.ctl.PutRuntime(controller_pb2.PutRuntimeRequest(runtime=rt), timeout=10)

    def run(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        """Run coro on the cluster's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def functions(self) -> list[Any]:
        """The stored functions, as ListFunctions answers them."""
        reply = self.ctl.ListFunctions(controller_pb2.ListFunctionsRequest(), timeout=10)
        return list(reply.functions)

    def runtimes(self) -> list[Any]:
        """The stored runtimes, as ListRuntimes answers them."""
        reply = self.ctl.ListRuntimes(controller_pb2.ListRuntimesRequest(), timeout=10)
        return list(reply.runtimes)

    def raw(self, address: str, method: str, data: bytes) -> grpc.RpcError | bytes:
        """Send bytes as the request of method (identity serializers); the
        answer's bytes, or the RpcError."""
        call = self.channels[address].unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        try:
            return call(data, timeout=10)  # type: ignore[no-any-return]
        except grpc.RpcError as e:
            return e

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.run(self.cluster.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def tcluster() -> Iterator[ThreadedCluster]:
    c = ThreadedCluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `galaxy certs init` directory for 127.0.0.1 and localhost (a test
    module may define its own)."""
    d = tmp_path_factory.mktemp("certs")
    tls.ensure(d, tls.DEFAULT_IDENTITIES, ["localhost", "127.0.0.1"])
    return d
