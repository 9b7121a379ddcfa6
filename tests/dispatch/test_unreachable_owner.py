"""A Dispatch instance that cannot reach a function's owner reports it; the
controller checks the owner at once and removes it if it does not answer,
so the function moves and requests are served without waiting for the
owner to fall silent. A healthy instance reported by mistake stays."""

from __future__ import annotations

import logging
import socket

import pytest

from controlplane.runtime import rendezvous
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, controller_pb2_grpc
from tests.cluster import small_cluster
from tests.runtimes import deploy

D = common_pb2.CONTROL_KIND_DISPATCH


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once closed


@pytest.mark.slow
async def test_dead_owner_is_removed_on_report_and_its_function_served(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.controller.service")
    c = await small_cluster()
    try:
        d0 = c.parts["d-0"]
        # A function whose owner is a Dispatch instance that died without
        # deregistering (its address answers nothing).
        name = next(
            f"fn-{i}" for i in range(100)
            if rendezvous.owner(f"fn-{i}", ["d-0", "d-ghost"]) == "d-ghost"
        )  # fmt: skip
        ghost = common_pb2.ControlInstance(
            id="d-ghost", kind=D, address=f"127.0.0.1:{_closed_port()}"
        )
        async with GalaxyClient(c.controller, timeout=20) as client:
            async with client.pool.stub(c.controller, controller_pb2_grpc.ControllerStub) as s:
                await s.RegisterInstance(ghost)
            await deploy(client, common_pb2.FunctionSpec(name=name, command=["x"]))
            got = await client.dispatch(name, deadline_s=20)
            await client.release(got)
            assert got.function.startswith(name)
        registry = c.parts["controller"].component.servicer.registry
        assert registry.get(D, "d-ghost") is None
        assert any("d-ghost reported unreachable" in m for m in caplog.messages)
        # d-0 is healthy: a report about it changes nothing.
        async with GalaxyClient(c.controller) as client:
            async with client.pool.stub(c.controller, controller_pb2_grpc.ControllerStub) as s:
                r = await s.ReportUnreachable(
                    common_pb2.ControlInstance(id="d-0", kind=D, address=d0.address)
                )
        assert not r.removed and registry.get(D, "d-0") is not None
    finally:
        await c.close()
