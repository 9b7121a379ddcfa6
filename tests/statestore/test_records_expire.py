"""Node and instance records expire with the process that wrote them, and
`galaxy store dump` shows them decoded. Real components, real etcd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import InProcessCluster, eventually, eventually_async
from tests.dispatch.test_state_offpath import etcd, keys  # noqa: F401 (fixture)
from tests.runtimes import deploy

pytestmark = pytest.mark.etcd
TTL = "1"


def dump(url: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "store", "dump", "--state", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.slow
async def test_records_are_dumped_decoded_and_expire_with_their_writer(etcd):  # noqa: F811
    c = InProcessCluster()
    try:
        await c.add("controller", "controller", "--state", etcd.url)
        await c.add("clustermgr", "cm-0", "--state", etcd.url, "--record-ttl-s", TTL)
        await c.add("schedule", "schedule-0")
        await c.add("dispatch", "d-0", "--state", etcd.url, "--record-ttl-s", TTL)
        await c.add("nodeagent", "agent-0", "--nodes", "2", "--sandbox", "emulated")
        async with GalaxyClient(c.controller) as client:
            await deploy(client, common_pb2.FunctionSpec(name="echo", command=["x"]))
            got = await client.dispatch("echo")
            await client.release(got)
        await asyncio.wait_for(c.parts["d-0"].component.recorder.writer.flush(), 30)
        await eventually(
            lambda: len(c.parts["cm-0"].component.servicer.registry.records()) == 2,
            what="nodes registered",
        )
        await asyncio.wait_for(c.parts["cm-0"].component.recorder.writer.flush(), 30)

        records = await asyncio.to_thread(dump, etcd.url)
        by_key = {r["key"]: r for r in records}
        spec = by_key["/galaxy/functions/echo"]
        assert spec["owner"] == "controller" and spec["value"]["name"] == "echo"
        rev = by_key["/galaxy/revisions/echo/00001"]
        assert rev["owner"] == "controller" and rev["value"]["revision"] == 1
        assert got.function == "echo-00001"  # instances run a revision
        inst = by_key[f"/galaxy/instances/{got.function}/{got.instance_id}"]
        assert inst["value"]["address"] == got.address
        nodes = [r for r in records if r["key"].startswith("/galaxy/nodes/")]
        assert len(nodes) == 2 and all("node_id" in r["value"] for r in nodes)

        # The writers go away: their records follow within the lease TTL;
        # the function spec (deployed = durable) stays.
        await c.remove("d-0")
        await c.remove("cm-0")

        async def records_gone() -> bool:
            left = await keys(etcd.url, "/galaxy/instances/") + await keys(
                etcd.url, "/galaxy/nodes/"
            )
            return not left

        # etcd expires leases on its own schedule: poll, bounded.
        await eventually_async(records_gone, within_s=15.0, what="records expire")
        assert await keys(etcd.url, "/galaxy/functions/") == ["/galaxy/functions/echo"]
        assert await keys(etcd.url, "/galaxy/revisions/") == ["/galaxy/revisions/echo/00001"]
    finally:
        await c.close()
