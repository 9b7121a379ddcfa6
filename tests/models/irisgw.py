"""A real control plane (in-process components, real instance processes)
with a gateway on a real socket, serving example functions: shared by the
batching and graph tests (tests/models, tests/gateway/test_graphs.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.gateway import main as gateway
from controlplane.gateway.config import GatewayConfig
from controlplane.runtime import runtimefiles
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from scripts.train_iris import train
from tests.cluster import InProcessCluster
from tests.integration.upctl import REPO

EXAMPLES = REPO / "examples"


def example(file: str, models: Path, **changes: Any) -> dict[str, Any]:
    """examples/FILE.yaml with absolute paths and changes, its model (if
    any) trained into models."""
    doc = yaml.safe_load((EXAMPLES / f"{file}.yaml").read_text())
    doc["artifact"] = str(EXAMPLES / doc["artifact"])
    if "model" in doc:
        path = models / Path(doc["model"]["uri"]).name
        if not path.exists():
            train(path, "tree" if "tree" in path.name else "logistic")
        doc["model"]["uri"] = str(path)
    return doc | changes


@contextlib.asynccontextmanager
async def serving(tmp: Path, cfg: GatewayConfig, docs: list[dict[str, Any]]) -> AsyncIterator[str]:
    """The gateway's URL, with the functions of docs deployed."""
    c = InProcessCluster()
    runner = proxy = client = None
    with pytest.MonkeyPatch.context() as mp:
        # The runtimes run `python3`: this interpreter's (scikit-learn, aiohttp).
        mp.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
        try:
            await c.add("controller", "controller")
            await c.add("clustermgr", "cm-0")
            await c.add("schedule", "s-0")
            await c.add("dispatch", "d-0")
            await c.add("nodeagent", "agent-0", "--nodes", "1", "--model-cache-dir",
                        str(tmp / "cache"))  # fmt: skip
            runner, proxy, address = await gateway.start(cfg, c.controller, "127.0.0.1", 0)
            client = GalaxyClient(c.controller)
            for rt in runtimefiles.load_dir(EXAMPLES / "runtimes"):
                await client.put_runtime(rt)
            for doc in docs:
                await client.deploy(specs.from_dict(doc))
            yield f"http://{address}"
        finally:
            if client is not None:
                await client.close()
            if runner is not None and proxy is not None:
                await gateway.stop(runner, proxy)
            await c.close()
