"""Schedule over real gRPC on loopback: a real node agent (emulated sandbox)
hosting three nodes, a ClusterMgr that feeds them to Schedule, and Schedule
placing instances on them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import SERVICE_NAME as AGENT_SERVICE
from controlplane.nodeagent.service import NodeAgentServicer
from controlplane.runtime.resources import Res
from controlplane.runtime.rpc import ChannelPool, create_server, insecure_channel
from functions.clustermgr.policy import NodeRegistry
from functions.clustermgr.service import SERVICE_NAME as CM_SERVICE
from functions.clustermgr.service import ClusterMgrServicer
from functions.schedule.policy import PlacementPolicy
from functions.schedule.service import SERVICE_NAME as SF_SERVICE
from functions.schedule.service import ScheduleServicer
from galaxy.v1 import (
    clustermgr_pb2,
    clustermgr_pb2_grpc,
    common_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
)
from tests.cluster import eventually

NODES = {"small": Res(1000, 4096, 0), "big": Res(4000, 4096, 0), "gpu": Res(1000, 4096, 1)}


@dataclass
class Stack:
    pool: ChannelPool
    agent: NodeAgentServicer
    agent_addr: str
    policy: PlacementPolicy
    sched: ScheduleServicer
    sf: Any  # ScheduleStub
    cm: ClusterMgrServicer
    cmf: Any  # ClusterMgrStub
    na: Any  # NodeAgentStub
    records: dict[str, bytes | None] = field(default_factory=dict)


def spec(
    name: str = "fn", cpu: int = 500, mem: int = 256, gpus: int = 0
) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(
        name=name,
        resources=common_pb2.Resources(cpu_millis=cpu, memory_mib=mem, gpus=gpus),
        concurrency=1,
        max_scale=100,
    )


def req(iid: str, fn: common_pb2.FunctionSpec) -> schedule_pb2.ScheduleRequest:
    return schedule_pb2.ScheduleRequest(instance_id=iid, function=fn)


async def serve(add: Callable[[Any, Any], None], servicer: Any, name: str) -> tuple[Any, str]:
    server, port, _ = create_server("127.0.0.1:0", [(add, servicer, name)])
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def make_stack() -> AsyncIterator[Callable[..., Awaitable[Stack]]]:
    cleanups: list[Callable[[], Awaitable[Any]]] = []

    async def make(**policy_kw: Any) -> Stack:
        pool = ChannelPool()
        cleanups.append(pool.close)
        agent = NodeAgentServicer(NODES.items(), EmulatedBackend())
        cleanups.append(agent.close)
        a_srv, a_addr = await serve(
            nodeagent_pb2_grpc.add_NodeAgentServicer_to_server, agent, AGENT_SERVICE
        )
        cleanups.append(lambda: a_srv.stop(None))
        agent.attach(a_addr, pool)
        policy_kw.setdefault("probe_ttl_s", 30.0)  # these tests decide what is stale
        policy_kw.setdefault("exact", False)  # most tests here are about probing
        policy = PlacementPolicy(rng=random.Random(3), **policy_kw)
        sched = ScheduleServicer(policy, schedule_id="s-1", pool=pool)
        cleanups.append(sched.close)
        s_srv, s_addr = await serve(
            schedule_pb2_grpc.add_ScheduleServicer_to_server, sched, SF_SERVICE
        )
        cleanups.append(lambda: s_srv.stop(None))
        records: dict[str, bytes | None] = {}
        cm = ClusterMgrServicer(
            NodeRegistry(), clustermgr_id="c-1", pool=pool, record=records.__setitem__
        )
        cleanups.append(cm.stop)
        c_srv, c_addr = await serve(
            clustermgr_pb2_grpc.add_ClusterMgrServicer_to_server, cm, CM_SERVICE
        )
        cleanups.append(lambda: c_srv.stop(None))
        chans = [insecure_channel(a) for a in (s_addr, c_addr, a_addr)]
        cleanups.extend(ch.close for ch in chans)
        st = Stack(
            pool, agent, a_addr, policy, sched, schedule_pb2_grpc.ScheduleStub(chans[0]),
            cm, clustermgr_pb2_grpc.ClusterMgrStub(chans[1]),
            nodeagent_pb2_grpc.NodeAgentStub(chans[2]), records,
        )  # fmt: skip
        m = common_pb2.Membership(
            epoch=1,
            instances=[
                common_pb2.ControlInstance(
                    id="s-1", kind=common_pb2.CONTROL_KIND_SCHEDULE, address=s_addr
                ),
                common_pb2.ControlInstance(
                    id="c-1", kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=c_addr
                ),
            ],
        )
        await st.sf.Coordinate(common_pb2.CoordinateRequest(membership=m), timeout=5)
        await st.cmf.Coordinate(common_pb2.CoordinateRequest(membership=m), timeout=5)
        for nid in NODES:
            reply = await st.cmf.RegisterNode(agent.heartbeat_status(nid), timeout=5)
            assert not reply.reregister and reply.heartbeat_interval_ms == 1000
        await cm.outbox.flush()
        return st

    yield make
    for c in reversed(cleanups):
        await c()


async def test_nodes_flow_from_clustermgr_to_schedule(make_stack) -> None:
    st = await make_stack()
    nodes = (await st.sf.ListNodes(schedule_pb2.ListNodesRequest(), timeout=5)).nodes
    assert {n.node_id: n.address for n in nodes} == {nid: st.agent_addr for nid in NODES}
    cluster = (await st.cmf.ListNodes(clustermgr_pb2.ListClusterNodesRequest(), timeout=5)).nodes
    assert {(c.status.node_id, c.alive, c.schedule_id) for c in cluster} == {
        (nid, True, "s-1") for nid in NODES
    }
    # Node records were written behind, keyed by node id.
    stored = {k: common_pb2.NodeStatus.FromString(v) for k, v in st.records.items() if v}
    assert {k: v.node_id for k, v in stored.items()} == {f"/galaxy/nodes/{n}": n for n in NODES}
    # A heartbeat with a higher seq that changed the node reaches Schedule
    # (an unchanged one right after registering is no news: it waits for
    # the refresh period; nor is a start Schedule placed itself: it waits
    # for company); an old one does not.
    beat = st.agent.heartbeat_status("big")
    beat.capacity.memory_mib += 256  # news: the node grew
    await st.cmf.Update(beat, timeout=5)
    await st.cm.outbox.flush()
    old = common_pb2.NodeStatus()
    old.CopyFrom(beat)
    old.seq -= 5
    assert not (await st.sf.ModNode(schedule_pb2.ModNodeRequest(op=1, node=old), timeout=5)).changed
    nodes = (await st.sf.ListNodes(schedule_pb2.ListNodesRequest(), timeout=5)).nodes
    assert next(n.seq for n in nodes if n.node_id == "big") == beat.seq


async def test_places_on_fitting_nodes_until_full(make_stack) -> None:
    st = await make_stack()
    rounds = "galaxy_probe_round_trip_seconds_count"
    before = REGISTRY.get_sample_value(rounds) or 0.0
    sum_before = REGISTRY.get_sample_value("galaxy_probe_round_trip_seconds_sum") or 0.0
    r = await st.sf.Schedule(req("g-1", spec("gpu-fn", cpu=500, gpus=1)), timeout=5)
    assert r.instance.node_id == "gpu" and r.schedule_id == "s-1"
    assert r.instance.node_address == st.agent_addr and r.instance.function == "gpu-fn"
    assert r.probes == 1 and r.scheduling_ms > 0  # only one node has a GPU
    # The probe's round trip is part of the scheduling latency it reports.
    assert REGISTRY.get_sample_value(rounds) == before + 1
    rt_sum = REGISTRY.get_sample_value("galaxy_probe_round_trip_seconds_sum") or 0.0
    assert 0 < rt_sum - sum_before <= r.scheduling_ms / 1000
    placed = {"g-1": "gpu"}
    # 500m pieces: 2 on small, 8 on big, 1 more on gpu. Then nothing fits.
    for i in range(11):
        r = await st.sf.Schedule(req(f"c-{i}", spec()), timeout=5)
        placed[r.instance.instance_id] = r.instance.node_id
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await st.sf.Schedule(req("one-too-many", spec()), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.details().startswith(
        "no node in partition of schedule s-1 fits cpu=500m mem=256MiB gpu=0: "
        "3 nodes, max free cpu 0m"
    )
    # The agent agrees with every reply, and no node is over capacity.
    on_agent = {}
    for nid, cap in NODES.items():
        lst = await st.na.ListNodeInstances(nodeagent_pb2.ListNodeInstancesRequest(node_id=nid))
        on_agent.update({i.instance_id: nid for i in lst.instances})
        assert st.agent.nodes[nid].capacity.allocated.fits_in(cap)
    assert on_agent == placed
    assert st.policy.stats.placements == 12 and st.policy.stats.rejections == 0


async def test_a_spec_larger_than_every_node_is_failed_precondition(make_stack) -> None:
    st = await make_stack()
    for need in (spec("huge", cpu=8000), spec("gpus", cpu=100, gpus=2)):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.sf.Schedule(req(f"i-{need.name}", need), timeout=5)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        assert "larger than any node's capacity" in e.value.details()
    # Larger than what is free now but not than a node: retry later.
    r = await st.sf.Schedule(req("fits-later", spec(cpu=4000)), timeout=5)
    assert r.instance.node_id == "big"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await st.sf.Schedule(req("full-now", spec(cpu=4000)), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("request_", "field_"),
    [
        (schedule_pb2.ScheduleRequest(function=spec()), "instance_id"),
        (schedule_pb2.ScheduleRequest(instance_id="x"), "function"),
        (req("x", common_pb2.FunctionSpec(resources=spec().resources)), "function.name"),
        (req("x", common_pb2.FunctionSpec(name="fn")), "function.resources"),
    ],
)
async def test_bad_request_is_invalid_argument(make_stack, request_, field_) -> None:
    st = await make_stack()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await st.sf.Schedule(request_, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field_ + " ")


async def test_bad_modnode_is_invalid_argument(make_stack) -> None:
    st = await make_stack()
    for bad in (
        schedule_pb2.ModNodeRequest(op=0, node=common_pb2.NodeStatus(node_id="n", address="a:1")),
        schedule_pb2.ModNodeRequest(op=1, node=common_pb2.NodeStatus(node_id="n")),
        schedule_pb2.ModNodeRequest(op=1, node=common_pb2.NodeStatus(address="a:1")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.sf.ModNode(bad, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(st.policy) == 3  # state untouched


async def test_schedule_is_idempotent_for_instance_id(make_stack) -> None:
    st = await make_stack()
    # Concurrent duplicates share one placement.
    replies = await asyncio.gather(
        *(st.sf.Schedule(req("dup", spec()), timeout=5) for _ in range(4))
    )
    assert all(r.instance == replies[0].instance for r in replies)
    # A repeat after success returns the remembered reply.
    again = await st.sf.Schedule(req("dup", spec()), timeout=5)
    assert again == replies[0]
    assert st.policy.stats.placements == 1
    nid = replies[0].instance.node_id
    lst = await st.na.ListNodeInstances(nodeagent_pb2.ListNodeInstancesRequest(node_id=nid))
    assert [i.instance_id for i in lst.instances] == ["dup"]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await st.sf.Schedule(req("dup", spec("other-fn")), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already used for function fn" in e.value.details()


async def test_stale_view_is_retried_on_another_node(make_stack) -> None:
    st = await make_stack(d=3)
    first = await st.sf.Schedule(req("warm", spec(cpu=100, mem=10)), timeout=5)
    assert first.instance.node_id == "big" and first.probes == 3  # least loaded of all
    # Someone else fills "big" behind Schedule's back: its cached view is stale.
    await st.na.CreateInstance(
        nodeagent_pb2.CreateInstanceRequest(
            node_id="big", instance_id="intruder", function=spec("x", cpu=3800, mem=10)
        ),
        timeout=5,
    )
    r = await st.sf.Schedule(req("after", spec(cpu=1000, mem=10)), timeout=5)
    assert r.instance.node_id in ("small", "gpu")
    assert r.probes == 0  # served from the cache, even after the refusal
    assert st.policy.stats.rejections == 1
    assert st.policy.free("big") == Res()  # marked full until re-probed


async def test_modnodes_batch_is_all_or_nothing_and_in_order():
    """ModNodes applies changes in order; one bad entry rejects the batch."""
    import grpc

    from controlplane.runtime import rpc
    from functions.schedule.policy import PlacementPolicy
    from functions.schedule.service import ScheduleServicer
    from galaxy.v1 import common_pb2, schedule_pb2, schedule_pb2_grpc

    servicer = ScheduleServicer(PlacementPolicy("s-0"), schedule_id="s-0")
    server, port, _ = rpc.create_server(
        "127.0.0.1:0",
        [(schedule_pb2_grpc.add_ScheduleServicer_to_server, servicer, "galaxy.v1.Schedule")],
    )
    await server.start()
    try:

        def up(n, seq=1):
            return schedule_pb2.ModNodeRequest(
                op=schedule_pb2.ModNodeRequest.OP_UPSERT,
                node=common_pb2.NodeStatus(
                    node_id=n,
                    address="127.0.0.1:9",
                    seq=seq,
                    capacity=common_pb2.Resources(cpu_millis=1000, memory_mib=1000),
                ),
            )

        rm = schedule_pb2.ModNodeRequest(
            op=schedule_pb2.ModNodeRequest.OP_REMOVE, node=common_pb2.NodeStatus(node_id="a")
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = schedule_pb2_grpc.ScheduleStub(ch)
            r = await stub.ModNodes(
                schedule_pb2.ModNodesRequest(changes=[up("a"), up("b"), rm, up("a", seq=1)]),
                timeout=5,
            )
            # REMOVE then UPSERT of the same seq: a restarted node is learnt again.
            assert list(r.changed) == [True, True, True, True]
            assert sorted(n.node_id for n in servicer.policy.nodes()) == ["a", "b"]
            bad = schedule_pb2.ModNodeRequest(
                op=schedule_pb2.ModNodeRequest.OP_UPSERT, node=common_pb2.NodeStatus(node_id="c")
            )
            try:
                await stub.ModNodes(schedule_pb2.ModNodesRequest(changes=[up("d"), bad]), timeout=5)
                raise AssertionError("a bad batch must be rejected")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert e.details().startswith("changes[1].node.address")
            assert "d" not in {n.node_id for n in servicer.policy.nodes()}
    finally:
        await server.stop(None)


async def test_exact_partition_places_without_probes_until_a_refusal(make_stack) -> None:
    """Exact partitions over real gRPC: no probe while the view is right; a
    node agent's refusal (someone else allocated) puts that node in doubt,
    the placement goes elsewhere, and the node is probed before its next use."""
    st = await make_stack(d=3, exact=True)
    first = await st.sf.Schedule(req("warm", spec(cpu=100, mem=10)), timeout=5)
    assert first.instance.node_id == "big" and first.probes == 0  # least loaded, no probe
    await st.na.CreateInstance(
        nodeagent_pb2.CreateInstanceRequest(
            node_id="big", instance_id="intruder", function=spec("x", cpu=3800, mem=10)
        ),
        timeout=5,
    )
    r = await st.sf.Schedule(req("after", spec(cpu=1000, mem=10)), timeout=5)
    assert r.instance.node_id in ("small", "gpu") and r.probes == 0
    assert st.policy.stats.rejections == 1  # "big" refused: the view was wrong
    nxt = await st.sf.Schedule(req("next", spec(cpu=50, mem=10)), timeout=5)
    assert nxt.probes == 1  # "big" is asked before it is used again
    assert st.policy.stats.probes == 1 and st.policy.stats.rejections == 1


async def test_a_full_placement_queue_sheds_with_resource_exhausted(make_stack) -> None:
    def shed() -> float:
        labels = {"reason": "queue_full"}
        return REGISTRY.get_sample_value("galaxy_schedule_rejected_total", labels) or 0.0

    def pending() -> float:
        return REGISTRY.get_sample_value("galaxy_schedule_pending") or 0.0

    st = await make_stack()
    st.sched.max_pending = 1
    backend = st.agent.backend
    assert isinstance(backend, EmulatedBackend)
    backend.start_delay_s = 60.0  # the placement waits on a start that lasts
    first = asyncio.ensure_future(st.sf.Schedule(req("slow", spec()), timeout=30))
    try:
        await eventually(lambda: st.sched.running == 1, what="the placement in progress")
        before, queued = shed(), pending()
        assert queued >= 1
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.sf.Schedule(req("next", spec()), timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1 placements in progress (max_pending 1)" in e.value.details()
        assert shed() == before + 1 and pending() == queued
        # A retry of the placement in progress joins it: not shed.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.sf.Schedule(req("slow", spec()), timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert shed() == before + 1
    finally:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)


async def test_a_create_past_its_deadline_is_stopped_before_unavailable(
    make_stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent would go on with the start its caller gave up on; Dispatch
    # then retries or spills the same id, maybe to another node: two
    # instances. Schedule stops it before it answers UNAVAILABLE.
    from functions.schedule import service as sf_service

    st = await make_stack()
    monkeypatch.setattr(sf_service, "_CREATE_MARGIN_S", 0.2)  # the CreateInstance deadline
    st.agent.backend.start_delay_s = 30.0  # a sandbox start far past it
    slow = spec()
    slow.startup_timeout_ms = 1
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await st.sf.Schedule(req("late-1", slow), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not any("late-1" in n.instances for n in st.agent.nodes.values())
    assert all(n.capacity.allocated == Res(0, 0, 0) for n in st.agent.nodes.values())
