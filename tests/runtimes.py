"""Deploying a test's command through a serving runtime.

DeployFunction takes no command (docs/security.md, "Serving runtimes"), so
a test that needs a given command registers a runtime whose template is
exactly that command and deploys a spec naming it. The stored spec then has
the same command, workdir and everything else the test gave: each test keeps
its meaning and its assertions.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from controlplane.runtime import runtimefiles, servingruntime
from galaxy.v1 import common_pb2

EXAMPLES_RUNTIMES = Path(__file__).resolve().parents[1] / "examples" / "runtimes"


def runtime_for(spec: common_pb2.FunctionSpec) -> common_pb2.ServingRuntime:
    """A runtime that runs exactly spec's command in spec's workdir (any env)."""
    digest = hashlib.sha256("\0".join([spec.workdir, *spec.command]).encode()).hexdigest()
    return common_pb2.ServingRuntime(
        name=f"cmd-{digest[:16]}",
        command=list(spec.command),
        workdir=spec.workdir,
        allowed_env=["*"],
    )


def split(
    spec: common_pb2.FunctionSpec,
) -> tuple[common_pb2.ServingRuntime, common_pb2.FunctionSpec]:
    """(runtime for spec's command, the spec as a developer sends it)."""
    rt = runtime_for(spec)
    named = common_pb2.FunctionSpec()
    named.CopyFrom(spec)
    del named.command[:]
    named.workdir = ""
    named.runtime = rt.name
    return rt, named


async def deploy(client: Any, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
    """Deploy spec (which has a command) with a GalaxyClient: register its
    runtime (idempotent), then deploy naming it."""
    rt, named = split(spec)
    await client.put_runtime(rt)
    return await client.deploy(named)  # type: ignore[no-any-return]


def python_runtime() -> common_pb2.ServingRuntime:
    """The examples' runtime (examples/runtimes/python.yaml): what
    examples/echo.yaml and stream.yaml name."""
    return runtimefiles.load_file(EXAMPLES_RUNTIMES / "python.yaml")


async def deploy_example(client: Any, spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
    """Deploy an example spec (naming the python runtime) with its runtime
    registered first, as `galaxy up` does."""
    await client.put_runtime(python_runtime())
    return await client.deploy(spec)  # type: ignore[no-any-return]


def emulated() -> common_pb2.ServingRuntime:
    """The runtime emulated-sandbox functions name."""
    return servingruntime.emulated()
