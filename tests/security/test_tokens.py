"""Bearer tokens and roles against a real `galaxy up` (mutual TLS and
tokens on, as by default): who may deploy, invoke and administer, in which
namespace, through gRPC, the gateway (curl, the openai package) and the CLI;
revocation; and that no secret is ever logged or answered."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import openai
import pytest

from controlplane.runtime import spec as specs
from controlplane.runtime.errors import GalaxyError
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from tests.integration.test_up import up  # noqa: F401 (the shared `galaxy up` fixture)
from tests.integration.upctl import REPO

pytestmark = pytest.mark.integration


def client(up: Any, token: str | None) -> GalaxyClient:  # noqa: F811
    return GalaxyClient(up.controller, timeout=30, tls=up.tls(), token=token)


def run(up: Any, token: str | None, call: Callable[[GalaxyClient], Awaitable[Any]]) -> Any:  # noqa: F811
    async def go() -> Any:
        async with client(up, token) as c:
            return await call(c)

    return asyncio.run(go())


def code_of(up: Any, token: str | None, call: Callable[[GalaxyClient], Awaitable[Any]]) -> str:  # noqa: F811
    try:
        run(up, token, call)
    except GalaxyError as e:
        return e.code.name
    return "OK"


def echo(name: str, namespace: str = "", public: bool = False) -> common_pb2.FunctionSpec:
    spec = specs.load_file(REPO / "examples" / "echo.yaml")
    spec.name = name
    spec.namespace = namespace
    spec.public = public  # the example is public; these tests say which they need
    return spec


@pytest.fixture(scope="module")
def tokens(up):  # noqa: F811
    """Tokens of each role, made by the admin (`galaxy up`'s token)."""
    out = {}
    for key, role, ns in (
        ("dev_a", "developer", "team-a"),
        ("dev_b", "developer", "team-b"),
        ("inv_a", "invoker", "team-a"),
    ):
        r = up.cli("tokens", "create", key, "--role", role, "--namespace", ns, "--json")
        assert r.returncode == 0, r.stderr
        out[key] = json.loads(r.stdout)["token"]
    # A developer deploys into its own namespace without naming it.
    stored = run(up, out["dev_a"], lambda c: c.deploy(echo("tok-a")))
    assert stored.namespace == "team-a"
    return out


def test_a_client_without_a_token_is_refused(up, tokens):  # noqa: F811
    assert code_of(up, None, lambda c: c.list_functions()) == "UNAUTHENTICATED"
    assert code_of(up, None, lambda c: c.dispatch("tok-a")) == "UNAUTHENTICATED"
    bad = tokens["dev_a"][:-4] + "0000"
    assert code_of(up, bad, lambda c: c.list_functions()) == "UNAUTHENTICATED"


def test_an_invoker_invokes_but_cannot_deploy(up, tokens):  # noqa: F811
    result = run(up, tokens["inv_a"], lambda c: c.invoke("tok-a", b"hi"))
    assert result.status == 200 and json.loads(result.body)["echo"] == "hi"
    assert code_of(up, tokens["inv_a"], lambda c: c.deploy(echo("inv-x"))) == "PERMISSION_DENIED"
    assert code_of(up, tokens["inv_a"], lambda c: c.get_function("tok-a")) == "PERMISSION_DENIED"
    assert code_of(up, tokens["inv_a"], lambda c: c.delete_function("tok-a")) == "PERMISSION_DENIED"


def test_namespaces_keep_developers_apart(up, tokens):  # noqa: F811
    b = tokens["dev_b"]
    before = run(up, up.token, lambda c: c.get_function("tok-a"))
    assert code_of(up, b, lambda c: c.get_function("tok-a")) == "PERMISSION_DENIED"
    assert code_of(up, b, lambda c: c.dispatch("tok-a")) == "PERMISSION_DENIED"
    assert code_of(up, b, lambda c: c.delete_function("tok-a")) == "PERMISSION_DENIED"
    # Taking the name over, by either namespace, is refused too.
    assert code_of(up, b, lambda c: c.deploy(echo("tok-a"))) == "PERMISSION_DENIED"
    assert code_of(up, b, lambda c: c.deploy(echo("tok-b", "team-a"))) == "PERMISSION_DENIED"
    assert [f.name for f in run(up, b, lambda c: c.list_functions())] == []
    # Nothing changed for the owner.
    after = run(up, tokens["dev_a"], lambda c: c.get_function("tok-a"))
    assert after.version == before.version
    # An admin sees every namespace; a namespace cannot change.
    assert "tok-a" in [f.name for f in run(up, up.token, lambda c: c.list_functions())]
    assert code_of(up, up.token, lambda c: c.deploy(echo("tok-a", "team-b"))) == (
        "FAILED_PRECONDITION"
    )


def test_only_admins_manage_tokens(up, tokens):  # noqa: F811
    mk = lambda c: c.create_token("x", "admin")  # noqa: E731
    assert code_of(up, tokens["dev_a"], mk) == "PERMISSION_DENIED"
    assert code_of(up, tokens["dev_a"], lambda c: c.status()) == "PERMISSION_DENIED"
    listed = run(up, up.token, lambda c: c.list_tokens())
    assert {t.role for t in listed} == {"admin", "developer", "invoker"}


def test_no_token_opens_an_internal_rpc(up, tokens):  # noqa: F811
    agent = up.component("agent-0")["address"]

    async def go() -> list[grpc.StatusCode]:
        codes = []
        md = (("authorization", f"Bearer {up.token}"),)
        async with up.channel(up.controller) as ch:
            stub = controller_pb2_grpc.ControllerStub(ch)
            for call in (
                stub.RegisterInstance(
                    common_pb2.ControlInstance(id="dispatch-0", kind=1, address="10.0.0.1:1"),
                    timeout=5,
                    metadata=md,
                ),
                stub.LookupToken(
                    controller_pb2.LookupTokenRequest(id="0" * 16), timeout=5, metadata=md
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call
                codes.append(e.value.code())
        async with up.channel(agent) as ch:
            from galaxy.v1 import nodeagent_pb2, nodeagent_pb2_grpc

            with pytest.raises(grpc.aio.AioRpcError) as e:
                await nodeagent_pb2_grpc.NodeAgentStub(ch).CreateInstance(
                    nodeagent_pb2.CreateInstanceRequest(node_id="node-0"), timeout=5, metadata=md
                )
            codes.append(e.value.code())
        return codes

    assert asyncio.run(go()) == [grpc.StatusCode.PERMISSION_DENIED] * 3


def test_the_gateway_needs_a_token_and_keeps_it_from_the_function(up, tokens):  # noqa: F811
    url = f"http://{up.endpoints['gateway']}/functions/tok-a"

    def curl(*args: str) -> tuple[int, dict[str, str], str]:
        r = subprocess.run(
            ["curl", "-sS", "--max-time", "30", "-D", "-", *args],
            capture_output=True, text=True, timeout=40,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        head, _, body = r.stdout.replace("\r\n", "\n").partition("\n\n")
        lines = head.splitlines()
        hdrs = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        return int(lines[0].split()[1]), {k.lower(): v for k, v in hdrs.items()}, body

    status, hdrs, _ = curl(url, "-d", "x")
    assert status == 401 and hdrs["www-authenticate"].startswith("Bearer")
    status, _, body = curl(url, "-H", f"Authorization: Bearer {tokens['dev_b']}", "-d", "x")
    assert status == 403 and "namespace team-a" in body
    status, _, body = curl(url, "-H", f"Authorization: Bearer {tokens['inv_a']}", "-d", "x")
    assert status == 200 and json.loads(body)["echo"] == "x"
    # The instance never sees the caller's Galaxy token.
    status, _, body = curl(
        url + "/headers", "-H", f"Authorization: Bearer {tokens['inv_a']}", "-H", "X-Mine: 1"
    )
    seen = {k.lower() for k in json.loads(body)["headers"]}
    assert status == 200 and "x-mine" in seen and "authorization" not in seen


def test_a_public_function_answers_anyone_and_only_invocations(up, tokens):  # noqa: F811
    run(up, tokens["dev_a"], lambda c: c.deploy(echo("tok-pub", public=True)))
    url = f"http://{up.endpoints['gateway']}/functions/tok-pub"
    r = subprocess.run(
        ["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}", url, "-d", "open"],
        capture_output=True, text=True, timeout=40,
    )  # fmt: skip
    body, _, status = r.stdout.rpartition("\n")
    assert status == "200" and json.loads(body)["echo"] == "open"
    # Over gRPC too, marked anonymous; but nothing else is open.
    assert run(up, None, lambda c: c.invoke("tok-pub", b"x")).status == 200
    assert code_of(up, None, lambda c: c.invoke("tok-a", b"x")) == "UNAUTHENTICATED"
    assert code_of(up, None, lambda c: c.get_function("tok-pub")) == "UNAUTHENTICATED"
    assert code_of(up, None, lambda c: c.delete_function("tok-pub")) == "UNAUTHENTICATED"
    run(up, tokens["dev_a"], lambda c: c.delete_function("tok-pub"))


def test_openai_client_with_a_token_as_its_api_key(up, tokens):  # noqa: F811
    base = f"http://{up.endpoints['gateway']}/v1"
    models = openai.OpenAI(base_url=base, api_key=tokens["dev_a"], max_retries=0).models.list()
    assert [m.id for m in models.data] == ["tok-a"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="not-a-token", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):  # an invoker cannot list
        openai.OpenAI(base_url=base, api_key=tokens["inv_a"], max_retries=0).models.list()


@pytest.mark.slow
def test_revocation_and_no_secret_in_logs(up, tokens):  # noqa: F811
    r = up.cli("tokens", "create", "short-lived", "--role", "developer", "--namespace", "team-a",
               "--json")  # fmt: skip
    made = json.loads(r.stdout)
    assert code_of(up, made["token"], lambda c: c.list_functions()) == "OK"
    assert up.cli("tokens", "delete", made["id"]).returncode == 0
    # The controller forgets a revoked token at once.
    assert code_of(up, made["token"], lambda c: c.list_functions()) == "UNAUTHENTICATED"
    listed = up.cli("tokens", "list").stdout
    assert made["id"] not in listed and "team-a" in listed
    secrets = [t.split("_")[2] for t in (*tokens.values(), made["token"], up.token)]
    logs = "".join(p.read_text(errors="replace") for p in (up.run_dir / "logs").glob("*.log"))
    assert "refused" in logs  # refusals are logged...
    assert not [s for s in secrets if s in logs]  # ... without a secret
