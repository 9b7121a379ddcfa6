"""Where the gateway finds a graph (``graphs/source.py``), against a real
in-process controller: a stored graph is served, a deleted one stops being
served once the cache bound has passed (injected clock), a stored graph wins
a name clash with a ``--graphs-dir`` file, and a name neither holds is 404
naming the path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.gateway.graphs import source
from controlplane.gateway.graphs.source import GraphSource
from controlplane.runtime import graphspec
from controlplane.runtime.errors import NotFound, Unavailable
from controlplane.sdk.client import GalaxyClient
from tests.cluster import InProcessCluster


def _doc(name: str, fn: str) -> dict[str, Any]:
    return {"name": name, "nodes": {"root": {
        "router": "Sequence", "steps": [{"name": "one", "function": fn}]}}}  # fmt: skip


def _fn(g: graphspec.Graph) -> str:
    return g.root.steps[0].function


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def client() -> AsyncIterator[GalaxyClient]:
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        async with GalaxyClient(c.controller, timeout=5.0) as g:
            yield g
    finally:
        await c.close()


async def test_a_deleted_graph_is_served_until_the_cache_bound_then_not(
    client: GalaxyClient,
) -> None:
    clock = Clock()
    graphs = GraphSource(client, {}, clock)
    await client.apply_graph(json.dumps(_doc("g", "echo-a")))
    assert _fn(await graphs.find("g", None)) == "echo-a"
    await client.apply_graph(json.dumps(_doc("g", "echo-b")))
    await client.delete_graph("g")
    clock.t = source.TTL_S - 0.01
    assert _fn(await graphs.find("g", None)) == "echo-a"  # the cached answer
    clock.t = source.TTL_S
    with pytest.raises(NotFound, match=r"^path: no graph 'g'$"):
        await graphs.find("g", None)
    # The refusal is kept as long: a graph applied now is seen after it.
    await client.apply_graph(json.dumps(_doc("g", "echo-b")))
    with pytest.raises(NotFound):
        await graphs.find("g", None)
    clock.t = 2 * source.TTL_S
    assert _fn(await graphs.find("g", None)) == "echo-b"


async def test_a_stored_graph_wins_a_name_clash_with_a_file(client: GalaxyClient) -> None:
    files = {n: graphspec.parse(_doc(n, "from-file")) for n in ("both", "file-only")}
    graphs = GraphSource(client, files, Clock())
    await client.apply_graph(json.dumps(_doc("both", "stored")))
    assert _fn(await graphs.find("both", None)) == "stored"
    assert _fn(await graphs.find("file-only", None)) == "from-file"
    assert _fn(await GraphSource(None, files).find("both", None)) == "from-file"


@pytest.mark.slow  # waits out the client's retries (about 2 s)
async def test_an_unreachable_controller_fails_the_lookup_within_its_bound() -> None:
    # A port nothing listens on: the controller is down.
    async with GalaxyClient("127.0.0.1:1", timeout=1.0) as c:
        with pytest.raises(Unavailable):
            await GraphSource(c, {}).find("g", None)


async def test_callers_that_miss_together_share_one_read(client: GalaxyClient) -> None:
    """Single flight: 20 concurrent lookups of one graph by one caller cost the
    controller one read; a caller cancelled mid-read does not fail the rest."""
    await client.apply_graph(json.dumps(_doc("g", "echo-a")))
    reads = 0
    gate, started = asyncio.Event(), asyncio.Event()
    real = client.get_graph

    async def counted(*a: Any, **kw: Any) -> Any:
        nonlocal reads
        reads += 1
        started.set()
        await gate.wait()
        return await real(*a, **kw)

    client.get_graph = counted  # type: ignore[method-assign]
    graphs = GraphSource(client, {}, Clock())
    calls = [asyncio.create_task(graphs.find("g", None)) for _ in range(20)]
    await started.wait()
    calls[0].cancel()
    gate.set()
    done = await asyncio.gather(*calls[1:])
    assert {_fn(g) for g in done} == {"echo-a"}
    assert reads == 1
