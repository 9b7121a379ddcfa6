"""A function's request timeout (spec field) bounds the wait for a slot and
is the lifetime of the slot's lease; per-function autoscaling settings in
the spec override Dispatch's flags. Real gRPC, in-process components."""

from __future__ import annotations

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.errors import DeadlineExceeded
from controlplane.sdk.client import GalaxyClient
from functions.dispatch.autoscale import AutoscaleSettings, FunctionAutoscaling
from functions.dispatch.autoscaling.keepalive import FixedKeepAlive, HybridHistogramKeepAlive
from galaxy.v1 import common_pb2
from tests.cluster import eventually, small_cluster
from tests.runtimes import deploy


@pytest.fixture
async def cluster():
    # Cold starts take 20 s here: far longer than any request timeout below.
    c = await small_cluster("--nodes", "1", "--sandbox", "emulated", "--start-delay-ms", "20000")
    try:
        yield c
    finally:
        await c.close()


async def test_request_timeout_bounds_the_wait_for_a_cold_start(cluster) -> None:
    async with GalaxyClient(cluster.controller) as client:
        await deploy(
            client, common_pb2.FunctionSpec(name="slow", command=["x"], request_timeout_ms=300)
        )
        with pytest.raises(DeadlineExceeded) as e:
            await client.dispatch("slow", deadline_s=15.0)
        assert "slow" in str(e.value)
        router = cluster.parts["d-0"].component.dispatcher.router_of("slow")
        # It gave up on the request timeout, not on the client's deadline and
        # not because the start ended: the instance is still starting.
        assert router.pending == 1
        assert router.lease_ttl_s == pytest.approx(0.3)


@pytest.mark.slow
async def test_lease_lives_as_long_as_the_request_timeout() -> None:
    c = await small_cluster()
    try:
        async with GalaxyClient(c.controller) as client:
            spec = common_pb2.FunctionSpec(
                name="f", command=["x"], concurrency=1, max_scale=1, request_timeout_ms=1500
            )
            await deploy(client, spec)
            held = await client.dispatch("f")  # never released: a client that died
            assert held.lease_ttl_ms == 1500
            router = c.parts["d-0"].component.dispatcher.router_of("f")
            assert router.load() == 1
            # Reclaimed after the function's timeout, not Dispatch's 300 s default.
            await eventually(lambda: router.load() == 0, within_s=10.0, what="lease reclaimed")
            again = await client.dispatch("f", deadline_s=5.0)
            assert again.instance_id == held.instance_id
            await client.release(again)
            # A redeploy with another timeout (a new revision) applies to new leases,
            # once the new revision has an instance to serve them.
            spec.request_timeout_ms = 0
            await deploy(client, spec)
            d0 = c.parts["d-0"].component.dispatcher
            await eventually(
                lambda: d0.router_of("f").lease_ttl_s == 300.0 and d0.router_of("f").live_count(),
                what="new revision serving with the default timeout",
            )
            fresh = await client.dispatch("f", deadline_s=5.0)
            assert fresh.lease_ttl_ms == 300_000
            await client.release(fresh)
    finally:
        await c.close()


def test_spec_autoscaling_overrides_the_dispatch_flags() -> None:
    flags = AutoscaleSettings(stable_window_s=60.0, scale_to_zero_grace_s=30.0, keepalive="hybrid")
    scaling = FunctionAutoscaling(flags, ManualClock())
    plain = common_pb2.FunctionSpec(name="plain", concurrency=4, version=1)
    tuned = common_pb2.FunctionSpec(
        name="tuned",
        concurrency=4,
        version=1,
        autoscaling=common_pb2.AutoscalingSpec(
            target_utilization=0.7,
            stable_window_ms=6000,
            panic_window_percent=50,
            scale_to_zero_grace_ms=1000,
            keepalive_ms=2500,
        ),
    )
    p = scaling._scaler(plain).config
    assert (p.target_utilization, p.stable_window_s, p.panic_window_fraction) == (1.0, 60.0, 0.1)
    assert p.scale_to_zero_grace_s == 30.0
    t = scaling._scaler(tuned).config
    assert (t.target_utilization, t.stable_window_s, t.panic_window_fraction) == (0.7, 6.0, 0.5)
    assert t.scale_to_zero_grace_s == 1.0
    # keepalive_ms alone means a fixed keep-alive of that length (the flags say hybrid).
    assert isinstance(scaling._scaler(plain).keepalive, HybridHistogramKeepAlive)
    kept = scaling._scaler(tuned).keepalive
    assert isinstance(kept, FixedKeepAlive)
    assert kept.seconds == 2.5
