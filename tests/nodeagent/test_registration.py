"""Registration and heartbeats: a node agent's Registrar against the real
Controller and ClusterMgr, run in-process on loopback gRPC (see peers.py).
What the agent did is read from the ClusterMgrs' node registries and RPCs,
the controller's membership and the servers' RPC counters."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from controlplane.runtime.loadreport import rpcs_handled
from galaxy.v1 import common_pb2, controller_pb2_grpc
from tests.cluster import eventually

from .faults import serve_hanging_clustermgr
from .peers import CLUSTERMGR_FLAGS, heartbeats, known, list_nodes, owners

REGISTER = "ClusterMgr/RegisterNode"


async def test_pool_registers_with_owners_and_heartbeats(peers, start_registrar, pool):
    await peers.add("controller", "controller")
    cms = [await peers.clustermgr("cm-a"), await peers.clustermgr("cm-b")]
    registrations = rpcs_handled(REGISTER)
    # The agent's own default interval is a minute: heartbeats within the
    # test's bounds come only at the 20 ms the ClusterMgrs ask for.
    reg, agent = await start_registrar(50, heartbeat_interval_ms=60_000)
    await asyncio.wait_for(reg.registered.wait(), 10)
    ids = list(agent.servicer.nodes)
    want = await owners(pool, peers.controller, ids)
    assert set(want.values()) == {"cm-a", "cm-b"}
    for cm in cms:
        listed = await list_nodes(pool, cm)
        assert set(listed) == {n for n in ids if want[n] == cm.name}
        for node in listed.values():
            assert node.alive and node.status.address == agent.address
            assert node.status.capacity.cpu_millis == 1000
    # Every node registered once, with its owner only.
    assert rpcs_handled(REGISTER) - registrations == 50
    # Then each heartbeats with a higher seq every time, at 20 ms.
    for cm in cms:
        await heartbeats(cm, [n for n in ids if want[n] == cm.name], 3)
    assert rpcs_handled(REGISTER) - registrations == 50  # no heartbeat was refused


async def test_reregisters_with_a_restarted_clustermgr(peers, start_registrar):
    await peers.add("controller", "controller")
    cm = await peers.clustermgr("cm")
    reg, agent = await start_registrar(5, max_backoff_s=0.1)
    await asyncio.wait_for(reg.registered.wait(), 10)
    ids = set(agent.servicer.nodes)
    assert set(known(cm)) == ids
    # Restart it at the same address: the agent's owner does not change, but
    # the new ClusterMgr knows no node and answers heartbeats "reregister".
    address = cm.address
    await peers.remove("cm")
    cm = await peers.add_at(address, "clustermgr", "cm", *CLUSTERMGR_FLAGS)
    assert not known(cm)
    await eventually(lambda: set(known(cm)) == ids, what="nodes registered again")
    await heartbeats(cm, ids, 2)
    assert all(reg.is_registered(n) for n in ids)


@pytest.mark.slow
async def test_waits_for_a_clustermgr_then_registers(peers, start_registrar):
    await peers.add("controller", "controller")  # no ClusterMgr in the membership
    asked = rpcs_handled("Controller/GetMembership")
    reg, agent = await start_registrar(3)
    await eventually(
        lambda: rpcs_handled("Controller/GetMembership") >= asked + 2, what="the agent asks again"
    )
    assert not reg.registered.is_set()
    cm = await peers.clustermgr("cm")
    await asyncio.wait_for(reg.registered.wait(), 10)
    assert set(known(cm)) == set(agent.servicer.nodes)


async def test_survives_controller_down_at_start(peers, start_registrar, caplog):
    caplog.set_level(logging.WARNING, logger="controlplane.nodeagent.registration")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    reg, agent = await start_registrar(2, controller=address, max_backoff_s=0.1)
    await eventually(
        lambda: f"cannot fetch membership from controller {address}" in caplog.text,
        what="the agent finding no controller",
    )
    await peers.add_at(address, "controller", "controller")  # comes up late
    cm = await peers.clustermgr("cm")
    await asyncio.wait_for(reg.registered.wait(), 10)
    assert set(known(cm)) == set(agent.servicer.nodes)


async def test_moves_nodes_when_a_clustermgr_joins(peers, start_registrar, pool):
    await peers.add("controller", "controller")
    cm_a = await peers.clustermgr("cm-a")
    reg, agent = await start_registrar(20)
    await asyncio.wait_for(reg.registered.wait(), 10)
    cm_b = await peers.clustermgr("cm-b")
    want = await owners(pool, peers.controller, agent.servicer.nodes)
    moved = {n for n, o in want.items() if o == "cm-b"}
    assert moved and len(moved) < 20  # 20 nodes over 2 owners: some move, not all
    await eventually(lambda: set(known(cm_b)) == moved, what="moved nodes registered at cm-b")
    await heartbeats(cm_b, moved, 2)
    # The old owner keeps none of them: an agent with a stale membership is
    # told wrong_owner instead of leaving a record that later turns "dead".
    stayed = set(want) - moved
    await heartbeats(cm_a, stayed, 2)
    assert set(known(cm_a)) == stayed


async def test_clustermgr_replaced_at_a_new_address(peers, start_registrar):
    await peers.add("controller", "controller")
    old = await peers.clustermgr("cm")
    reg, agent = await start_registrar(4, max_backoff_s=0.1)
    await asyncio.wait_for(reg.registered.wait(), 10)
    await peers.remove("cm")
    cm = await peers.clustermgr("cm")
    assert cm.address != old.address
    ids = set(agent.servicer.nodes)
    await eventually(lambda: set(known(cm)) == ids, what="nodes registered at the new address")
    await heartbeats(cm, ids, 2)


async def test_hung_clustermgr_delays_no_other_node(peers, start_registrar, pool):
    await peers.add("controller", "controller")
    cm_a = await peers.clustermgr("cm-a")
    hung, server, address = await serve_hanging_clustermgr()
    try:
        # Registered with the real controller as its host would register it.
        async with pool.stub(peers.controller, controller_pb2_grpc.ControllerStub) as ctl:
            await ctl.RegisterInstance(
                common_pb2.ControlInstance(
                    id="cm-hung", kind=common_pb2.CONTROL_KIND_CLUSTERMGR, address=address
                ),
                timeout=5,
            )
        reg, agent = await start_registrar(20, rpc_timeout_s=30.0)
        want = await owners(pool, peers.controller, agent.servicer.nodes)
        stuck = {n for n, o in want.items() if o == "cm-hung"}
        live = {n for n, o in want.items() if o == "cm-a"}
        assert stuck and live and len(stuck | live) == 20
        await eventually(lambda: hung.nodes() == stuck, what="calls hanging at cm-hung")
        # While those calls hang, cm-a's nodes register and keep their 20 ms
        # heartbeat.
        await heartbeats(cm_a, live, 5)
        assert all(reg.is_registered(n) for n in live)
        assert hung.nodes() == stuck
        assert not any(reg.is_registered(n) for n in stuck)
    finally:
        await server.stop(None)


async def test_a_free_is_reported_at_once_not_at_the_next_heartbeat(peers, start_registrar):
    """Exact partitions learn of frees only from statuses: the agent sends
    a node's status right after an instance's capacity is freed there."""
    from galaxy.v1 import nodeagent_pb2

    await peers.add("controller", "controller")
    # Heartbeats a minute apart: any status within the test is a report.
    cm = await peers.add(
        "clustermgr", "cm-a", "--heartbeat-ms", "60000", "--dead-after-ms", "600000"
    )
    reg, agent = await start_registrar(1, heartbeat_interval_ms=60_000)
    agent.servicer.on_freed = reg.report_soon  # as the node agent's main wires it
    await asyncio.wait_for(reg.registered.wait(), 10)
    spec = common_pb2.FunctionSpec(
        name="f", command=["x"], resources=common_pb2.Resources(cpu_millis=400, memory_mib=10)
    )
    await agent.servicer.CreateInstance(
        nodeagent_pb2.CreateInstanceRequest(node_id="node-0", instance_id="i", function=spec), None
    )
    await agent.servicer.DeleteInstance(
        nodeagent_pb2.DeleteInstanceRequest(node_id="node-0", instance_id="i"), None
    )

    def freed() -> bool:
        rec = known(cm).get("node-0")
        return rec is not None and rec.status.allocated.cpu_millis == 0 and rec.status.seq > 0

    # Registered before the create (allocated 0), so wait for a status sent
    # after the delete: its seq is above the create's.
    seq_after_create = agent.servicer.nodes["node-0"].seq
    await eventually(
        lambda: freed() and known(cm)["node-0"].status.seq >= seq_after_create,
        within_s=5,
        what="a status after the free",
    )
