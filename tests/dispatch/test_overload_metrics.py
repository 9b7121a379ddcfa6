"""Overload is visible where an operator looks: Dispatch counts the calls it
refuses by reason and shows the requests waiting for a slot."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from controlplane.runtime.errors import ResourceExhausted
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2
from tests.cluster import eventually, small_cluster
from tests.runtimes import deploy


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.slow
async def test_queue_full_is_counted_and_waiting_requests_are_shown() -> None:
    # Slow cold starts: the first request waits while its instance starts.
    c = await small_cluster(
        "--nodes", "1", "--sandbox", "emulated", "--start-delay-ms", "3000",
        dispatch_flags=("--max-queue", "1"),
    )  # fmt: skip
    try:
        async with GalaxyClient(c.controller) as client:
            await deploy(
                client, common_pb2.FunctionSpec(name="q", command=["x"], concurrency=1, max_scale=1)
            )
            before = _sample("galaxy_dispatch_rejected_total", reason="queue_full")
            first = asyncio.create_task(client.dispatch("q", deadline_s=20))
            await eventually(
                lambda: _sample("galaxy_dispatch_waiting") == 1, what="one request waiting"
            )
            with pytest.raises(ResourceExhausted):
                await client.dispatch("q", deadline_s=5)
            assert _sample("galaxy_dispatch_rejected_total", reason="queue_full") == before + 1
            got = await first
            await client.release(got)
            assert _sample("galaxy_dispatch_waiting") == 0
    finally:
        await c.close()
