"""Flags and the host Component of Schedule and ClusterMgr."""

from __future__ import annotations

import argparse

import pytest

from controlplane.runtime.host import HostContext
from controlplane.runtime.rpc import ChannelPool
from functions.clustermgr import main as cm_main
from functions.schedule import main as sf_main
from galaxy.v1 import common_pb2


def parse(mod, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    return p.parse_args(argv)


def ctx(instance_id: str, pool: ChannelPool) -> HostContext:
    return HostContext(instance_id, "127.0.0.1:1", "", "127.0.0.1:2", pool)


async def test_schedule_flags_and_component() -> None:
    c = sf_main.build(parse(sf_main, []))
    assert (c.policy.d, c.policy.probe_cache, c.policy.probe_ttl_s) == (2, True, 0.2)
    c = sf_main.build(
        parse(sf_main, ["--probe-d", "3", "--no-probe-cache", "--probe-ttl-ms", "50"])
    )
    assert (c.policy.d, c.policy.probe_cache, c.policy.probe_ttl_s) == (3, False, 0.05)
    assert c.kind == common_pb2.CONTROL_KIND_SCHEDULE
    assert [s[2] for s in c.services()] == ["galaxy.v1.Schedule"]
    pool = ChannelPool()
    await c.start(ctx("s-7", pool))
    assert c.servicer.schedule_id == c.policy.schedule_id == "s-7" and c.servicer.pool is pool
    c.on_membership(common_pb2.Membership(epoch=4))
    assert c.servicer.membership.epoch == 4
    await c.stop()
    with pytest.raises(SystemExit):
        parse(sf_main, ["--probe-d", "0"])


async def test_clustermgr_flags_and_component() -> None:
    c = cm_main.build(parse(cm_main, []))
    assert c.registry.dead_after_s == 3.0 and c.servicer.heartbeat_s == 1.0
    c = cm_main.build(parse(cm_main, ["--heartbeat-ms", "200"]))
    assert c.registry.dead_after_s == pytest.approx(0.6)  # 3 heartbeats
    c = cm_main.build(parse(cm_main, ["--heartbeat-ms", "200", "--dead-after-ms", "5000"]))
    assert c.registry.dead_after_s == 5.0
    assert c.kind == common_pb2.CONTROL_KIND_CLUSTERMGR
    assert [s[2] for s in c.services()] == ["galaxy.v1.ClusterMgr"]
    pool = ChannelPool()
    await c.start(ctx("c-7", pool))
    assert c.servicer.clustermgr_id == "c-7" and c.servicer.outbox.pool is pool
    c.on_membership(common_pb2.Membership(epoch=2))
    assert c.registry.membership.epoch == 2
    await c.stop()  # cancels the liveness timer
    assert c.servicer._timer is None and not c.servicer._started
