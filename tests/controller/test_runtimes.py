"""Serving runtimes through the real Controller API (gRPC over loopback, the
in-process cluster): register, list, get, delete; a deploy that names a
runtime stores the resolved command and a real instance runs it; every
refusal names its field and leaves the stored state as it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.runtime.errors import FailedPrecondition, GalaxyError, InvalidArgument, NotFound
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, small_cluster
from tests.runtimes import python_runtime

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ECHO = str(EXAMPLES / "echo_server.py")
Rules = common_pb2.ServingRuntime.ArtifactRules


def _py(name: str = "py", **kw: object) -> common_pb2.ServingRuntime:
    """The examples' python runtime, renamed, admitting a flag and APP_*."""
    rt = python_runtime()
    rt.name = name
    rt.allowed_args[:] = ["--greeting"]
    rt.allowed_env[:] = ["APP_*"]
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(rt, k)[:] = v
        elif isinstance(v, Rules):
            rt.artifact.CopyFrom(v)
        else:
            setattr(rt, k, v)
    return rt


@pytest.fixture
async def client() -> AsyncIterator[GalaxyClient]:
    c = await small_cluster()
    try:
        async with GalaxyClient(c.controller, timeout=10.0) as g:
            yield g
    finally:
        await c.close()


async def _state(c: GalaxyClient) -> tuple[list[object], list[object]]:
    return list(await c.list_functions()), list(await c.list_runtimes())


async def _refused(c: GalaxyClient, call: object, kind: type[GalaxyError]) -> str:
    """Run the call, check it is refused with kind and changed nothing;
    its message."""
    before = await _state(c)
    with pytest.raises(kind) as e:
        await call  # type: ignore[misc]
    assert await _state(c) == before, "a refused call changed the stored state"
    assert len(e.value.message) < 400
    return e.value.message


async def test_register_list_get_delete(client: GalaxyClient) -> None:
    stored = await client.put_runtime(_py("py", description="a test runtime"))
    assert stored.version > 0 and stored.description == "a test runtime"
    again = await client.put_runtime(_py("py", description="a test runtime"))
    assert again.version == stored.version  # unchanged: nothing written
    await client.put_runtime(_py("another"))
    assert [r.name for r in await client.list_runtimes()] == ["another", "py"]
    got = await client.get_runtime("py")
    assert list(got.command) == ["python3", "-u", "{artifact}", "{args}"]
    await client.delete_runtime("another")
    assert [r.name for r in await client.list_runtimes()] == ["py"]
    msg = await _refused(client, client.get_runtime("another"), NotFound)
    assert msg.startswith("runtime 'another' not found")
    await _refused(client, client.delete_runtime("another"), NotFound)


async def test_a_bad_runtime_is_refused_naming_the_field(client: GalaxyClient) -> None:
    for rt, start in [
        (_py(command=["{artifact}"]), "command[0]: must be the program"),
        (_py(allowed_args=["-x"]), "allowed_args[0]: must be a flag"),
        (_py(artifact=Rules(required=True)), "artifact.prefixes: required"),
        (_py("Bad Name"), "name:"),
    ]:
        msg = await _refused(client, client.put_runtime(rt), InvalidArgument)
        assert msg.startswith(start), msg


async def test_deploy_resolves_the_runtime_and_refusals_name_the_field(
    client: GalaxyClient,
) -> None:
    await client.put_runtime(_py())
    spec = common_pb2.FunctionSpec(
        name="f", runtime="py", artifact=ECHO, args=["--greeting=hi"], env={"APP_MODE": "x"}
    )
    stored = await client.deploy(spec)
    assert list(stored.command) == ["python3", "-u", ECHO, "--greeting=hi"]
    # The runtime's defaults (examples/runtimes/python.yaml) where the spec left 0.
    assert (stored.concurrency, stored.readiness_path, stored.resources.cpu_millis) == (
        4,
        "/healthz",
        250,
    )
    assert stored.runtime == "py" and stored.artifact == ECHO
    for bad, kind, start in [
        (dict(runtime="nope"), InvalidArgument, "runtime: no runtime 'nope' is registered"),
        (dict(runtime=""), InvalidArgument, "runtime: required"),
        (dict(command=["sh", "-c", "id"]), InvalidArgument, "command: set by the runtime"),
        (dict(workdir="/tmp"), InvalidArgument, "workdir: set by the runtime"),
        (dict(args=["--port=1"]), InvalidArgument, "args[0]: runtime py admits only --flag"),
        (dict(args=["-c"]), InvalidArgument, "args[0]:"),
        (dict(env={"PYTHONPATH": "/tmp"}), InvalidArgument, "env key PYTHONPATH: runtime py"),
        (dict(artifact="/etc/passwd"), InvalidArgument, "artifact: runtime py admits only"),
        (dict(artifact=ECHO + ".sh"), InvalidArgument, "artifact: runtime py admits only"),
        (dict(artifact=f"{EXAMPLES}/../x.py"), InvalidArgument, "artifact: must not contain"),
        (dict(artifact=""), InvalidArgument, "artifact: required by runtime py"),
    ]:
        s = common_pb2.FunctionSpec()
        s.CopyFrom(spec)
        s.name = "g"
        for k, v in bad.items():
            if isinstance(v, list):
                getattr(s, k)[:] = v
            elif isinstance(v, dict):
                s.env.clear()
                s.env.update(v)
            else:
                setattr(s, k, v)
        msg = await _refused(client, client.deploy(s), kind)
        assert msg.startswith(start), msg


async def test_a_runtime_in_use_cannot_be_deleted(client: GalaxyClient) -> None:
    await client.put_runtime(_py())
    await client.deploy(common_pb2.FunctionSpec(name="user", runtime="py", artifact=ECHO))
    msg = await _refused(client, client.delete_runtime("py"), FailedPrecondition)
    assert "function user" in msg and msg.startswith("name: runtime py is used by")
    await client.delete_function("user")
    await client.delete_runtime("py")


async def test_changing_a_runtime_leaves_deployed_functions_until_redeployed(
    client: GalaxyClient,
) -> None:
    await client.put_runtime(_py())
    spec = common_pb2.FunctionSpec(name="f", runtime="py", artifact=ECHO)
    first = await client.deploy(spec)
    await client.put_runtime(_py(command=["python3", "-X", "dev", "{artifact}", "{args}"]))
    kept = await client.get_function("f")
    assert list(kept.command) == list(first.command) and kept.revision == first.revision
    second = await client.deploy(spec)
    assert list(second.command) == ["python3", "-X", "dev", ECHO]
    assert second.revision == first.revision + 1


async def test_a_deployed_runtime_runs_a_real_instance() -> None:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "1")  # process sandbox
        async with GalaxyClient(c.controller, timeout=30.0) as g:
            await g.put_runtime(_py())
            await g.deploy(
                common_pb2.FunctionSpec(
                    name="echo", runtime="py", artifact=ECHO, args=["--greeting=hi"]
                )
            )
            r = await g.invoke("echo", b"through a runtime")
            assert r.status == 200 and b"through a runtime" in r.body
            assert r.instance.cold_start
    finally:
        await c.close()
