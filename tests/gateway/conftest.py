"""A real control plane (in-process components, real process sandboxes)
with a gateway on a real socket, and the example functions deployed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.gateway import main as gateway
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.proxy import Proxy
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from tests.cluster import InProcessCluster
from tests.runtimes import python_runtime

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Gateway:
    cluster: InProcessCluster
    address: str
    proxy: Proxy
    client: GalaxyClient

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    c = InProcessCluster()
    runner = None
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0")
        await c.add("nodeagent", "agent-0", "--nodes", "2")
        runner, proxy, address = await gateway.start(
            GatewayConfig(request_timeout_s=30.0), c.controller, "127.0.0.1", 0
        )
        client = GalaxyClient(c.controller)
        await client.put_runtime(python_runtime())  # what `galaxy up` registers
        for f in ("echo.yaml", "stream.yaml"):
            await client.deploy(specs.load_file(str(EXAMPLES / f)))
        yield Gateway(c, address, proxy, client)
        await client.close()
    finally:
        if runner is not None:
            await gateway.stop(runner, proxy)
        await c.close()
