"""The SDK absorbs a dead Dispatch instance and an unreachable function
instance: real components, real sockets, nothing raw reaches the caller."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from controlplane.runtime.errors import FailedPrecondition, GalaxyError, Unavailable
from controlplane.runtime.membership import MembershipView
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from tests.cluster import InProcessCluster, eventually
from tests.runtimes import deploy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _dead_address() -> str:
    # A port nothing listens on (bound, then closed): connections are refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_dispatch_fails_over_from_a_dead_dispatch_instance() -> None:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller", "--member-timeout-s", "1")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated")
        async with GalaxyClient(c.controller, timeout=20.0) as client:
            # A Dispatch instance that died without deregistering: still in
            # the membership until the controller notices its silence.
            dead = common_pb2.ControlInstance(
                id="d-dead", kind=common_pb2.CONTROL_KIND_DISPATCH, address=_dead_address()
            )
            async with client.pool.stub(c.controller, controller_pb2_grpc.ControllerStub) as s:
                await s.RegisterInstance(dead)
                # It reported once, then went silent (it was killed).
                await s.ReportLoad(controller_pb2.LoadReport(instance=dead))
            await client.refresh_membership()
            # A function the dead instance owns.
            name = next(
                f"fn-{i}"
                for i in range(1000)
                if client.membership.owner(common_pb2.CONTROL_KIND_DISPATCH, f"fn-{i}").id
                == "d-dead"
            )
            await deploy(client, common_pb2.FunctionSpec(name=name, command=["x"]))
            got = await client.dispatch(name)
            assert got.instance_id and client.failovers >= 1
            assert "d-dead" not in client.membership.ids(common_pb2.CONTROL_KIND_DISPATCH)
            await client.release(got)
    finally:
        await c.close()


async def test_dispatch_tries_elsewhere_when_a_stopping_dispatch_cancels_it() -> None:
    """A Dispatch instance whose stop grace runs out cancels the calls it
    still holds: the caller sees CANCELLED, which it did not ask for, and
    tries the next instance as after UNAVAILABLE (a chaos takeover failed
    such requests before)."""

    calls = 0

    async def cancelled(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        # As a stopping Dispatch: it has left the membership (deregistered,
        # then the server's stop), and its grace runs out on this call.
        nonlocal calls
        calls += 1
        async with grpc.aio.insecure_channel(c.controller) as ch:
            await controller_pb2_grpc.ControllerStub(ch).DeregisterInstance(inst, timeout=5)
        await context.abort(grpc.StatusCode.CANCELLED, "")
        raise AssertionError("abort raises")

    stopping = grpc.aio.server()
    stopping.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "galaxy.v1.Dispatch", {"Dispatch": grpc.unary_unary_rpc_method_handler(cancelled)}
            ),
        )
    )
    port = stopping.add_insecure_port("127.0.0.1:0")
    await stopping.start()
    inst = common_pb2.ControlInstance(
        id="d-stopping", kind=common_pb2.CONTROL_KIND_DISPATCH, address=f"127.0.0.1:{port}"
    )
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated")
        async with GalaxyClient(c.controller, timeout=20.0) as client:
            async with client.pool.stub(c.controller, controller_pb2_grpc.ControllerStub) as s:
                await s.RegisterInstance(inst)
            await client.refresh_membership()
            name = next(
                f"fn-{i}"
                for i in range(1000)
                if client.membership.owner(common_pb2.CONTROL_KIND_DISPATCH, f"fn-{i}").id
                == "d-stopping"
            )
            await deploy(client, common_pb2.FunctionSpec(name=name, command=["x"]))
            got = await client.dispatch(name)
            assert got.instance_id and client.failovers >= 1 and calls >= 1
            await client.release(got)
    finally:
        await c.close()
        await stopping.stop(0)


@pytest.mark.slow
async def test_dispatch_waits_for_a_dispatch_instance_within_its_deadline() -> None:
    """No Dispatch instance registered yet (a start, a restart, a controller
    taking over): the SDK waits for one, within the call's deadline, instead
    of failing at once; with none by the deadline it says why."""
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("nodeagent", "agent-0", "--nodes", "1", "--sandbox", "emulated")
        async with GalaxyClient(c.controller, timeout=30.0) as client:
            await deploy(client, common_pb2.FunctionSpec(name="f", command=["x"]))
            with pytest.raises(FailedPrecondition, match="no Dispatch instance is registered"):
                await client.dispatch("f", deadline_s=2.0)
            waited = client.failovers
            assert waited >= 1
            call = asyncio.create_task(client.dispatch("f"))
            await eventually(lambda: client.failovers > waited, what="the call waiting")
            assert not call.done()
            await c.add("dispatch", "d-0")
            got = await asyncio.wait_for(call, 30.0)
            assert got.instance_id
            await client.release(got)
    finally:
        await c.close()


@pytest.mark.slow
async def test_errors_are_typed_never_raw() -> None:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        async with GalaxyClient(c.controller, timeout=1.0) as client:
            # No Dispatch instance at all (waited for until the deadline).
            try:
                await client.dispatch("nothing-here")
            except GalaxyError as e:
                assert e.code.name in ("FAILED_PRECONDITION", "UNAVAILABLE")
            else:
                raise AssertionError("dispatch without Dispatch instances succeeded")
        # A controller that is not there: a typed UNAVAILABLE, not a raw error.
        async with GalaxyClient(_dead_address(), timeout=2.0) as client:
            client.membership = MembershipView()
            try:
                await client.list_functions()
            except Unavailable as e:
                assert e.code.name == "UNAVAILABLE"
            else:
                raise AssertionError("a dead controller answered")
    finally:
        await c.close()


@pytest.mark.slow
async def test_invoke_replaces_an_instance_that_cannot_be_reached() -> None:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "2")
        async with GalaxyClient(c.controller, timeout=30.0) as client:
            spec = common_pb2.FunctionSpec(
                name="echo",
                command=["python3", "-u", str(EXAMPLES / "echo_server.py")],
                readiness_path="/healthz",
                concurrency=1,
                max_scale=3,
            )
            await deploy(client, spec)
            first = await client.invoke("echo", b"hi")
            assert first.status == 200
            # Make the warm instance unreachable as seen by Dispatch: its
            # routed address now points at a closed port.
            router = c.parts["d-0"].component.servicer.router_of("echo")
            inst = router.instances[first.instance.instance_id]
            inst.address = _dead_address()
            r = await client.invoke("echo", b"again")
            assert r.status == 200 and b"again" in r.body
            assert r.instance.instance_id != first.instance.instance_id
            assert client.failovers >= 1
            await eventually(lambda: all(i.in_flight == 0 for i in router.instances.values()),
                             what="slots released")  # fmt: skip
    finally:
        await c.close()
