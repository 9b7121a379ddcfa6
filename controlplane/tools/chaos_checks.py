"""What `galaxy chaos` checks in a control plane after a fault: duplicate
and leaked instances (GetClusterStatus), the write-behind backlog (the
components' /metrics) and scale actions applied twice (the leaders' action
log in etcd)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from controlplane.controller.leader import DEFAULT_PREFIX
from controlplane.launch.up import Supervisor
from controlplane.runtime import rpc, tlsfiles
from controlplane.runtime.config import RpcConfig
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import nodeagent_pb2, nodeagent_pb2_grpc
from statestore import open_store


async def cluster_check(c: GalaxyClient) -> dict[str, int]:
    """Duplicate instances (an id listed twice) and leaked allocations
    (instances a node agent holds that no Dispatch instance routes to), from
    GetClusterStatus."""
    st = await c.status()
    ids = [i.instance.instance_id for i in st.instances]
    known: dict[str, int] = {}
    for i in st.instances:
        known[i.instance.node_id] = known.get(i.instance.node_id, 0) + 1
    leaked = sum(
        max(0, n.status.instances - known.get(n.status.node_id, 0)) for n in st.nodes if n.alive
    )
    # The reverse: routed by Dispatch but not run by the node's agent (or on
    # a node not alive), so a grant may point at an instance that is gone.
    ran = {n.status.node_id: n.status.instances for n in st.nodes if n.alive}
    ghosts = sum(max(0, k - ran.get(node, 0)) for node, k in known.items())
    return {
        "instances": len(ids),
        "duplicate_instances": len(ids) - len(set(ids)),
        "leaked_instances": leaked,
        "ghost_instances": ghosts,
        "nodes_alive": sum(1 for n in st.nodes if n.alive),
    }


def agent_pool(sup: Supervisor) -> rpc.ChannelPool:
    """A channel pool for the node agents' internal API. It takes a
    component's certificate (Dispatch's: what Dispatch itself calls them
    with); the checks only read."""
    tls = tlsfiles.config("dispatch", sup.tls_dir) if sup.tls_dir else None
    return rpc.ChannelPool(RpcConfig(deadline_s=10.0, tls=tls))


#: Looks at one node before an UNAVAILABLE is final. A look only reads, so
#: another is safe; one refused connection (a node agent busy starting
#: hundreds of instances closed a TLS handshake in one CI run) must not
#: abort a whole experiment.
LOOKS = 3
LOOK_AGAIN_S = 0.05


async def list_node(
    pool: rpc.ChannelPool, address: str, node: str
) -> nodeagent_pb2.ListNodeInstancesReply:
    """The ready instances a node agent runs on one of its nodes."""
    req = nodeagent_pb2.ListNodeInstancesRequest(node_id=node)
    for look in range(LOOKS):
        try:
            async with pool.stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
                return await s.ListNodeInstances(req)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or look == LOOKS - 1:
                raise
            await asyncio.sleep(LOOK_AGAIN_S * (look + 1))
    raise AssertionError("unreachable")


async def ghost_ids(c: GalaxyClient, sup: Supervisor, pool: rpc.ChannelPool) -> list[str]:
    """Instances Dispatch routes that no running node agent runs, by id
    (``cluster_check`` compares counts, which a heartbeat's lag skews both
    ways: an instance routed before its agent's next beat counts as a
    ghost, and a restarted agent's starting instances hide real ones).

    Dispatch's view is read first and the agents' second: an agent holds an
    instance from before Dispatch can route it, so a start between the two
    reads is never counted. An exit between them could be; the checks run
    where none is expected. An agent that does not answer runs nothing."""
    st = await c.status()
    routed = {(i.instance.node_id, i.instance.instance_id) for i in st.instances}
    ran: set[tuple[str, str]] = set()
    for child in list(sup.children):
        address = child.ready.get("address")
        if not child.name.startswith("agent-") or child.proc.returncode is not None or not address:
            continue
        for node in child.ready.get("nodes", []):
            with contextlib.suppress(grpc.aio.AioRpcError):
                r = await list_node(pool, address, node)
                ran |= {(node, i.instance_id) for i in r.instances}
    return sorted(iid for node, iid in routed - ran)


#: How long after the load a leak or ghost may last (issue: "leaks of any
#: kind gone within 5 s"), plus the heartbeat that reports the agents' counts.
LEAKS_GONE_WITHIN_S = 6.0


async def leaks_gone(c: GalaxyClient, within_s: float = LEAKS_GONE_WITHIN_S) -> float | None:
    """Seconds from now until no node agent runs an instance nobody routes
    and Dispatch routes none the agents do not run (None: not within
    ``within_s``). Read after the load, when no start is in flight: a start
    under way counts on its agent before Dispatch routes it."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:
        check = await cluster_check(c)
        if check["leaked_instances"] == 0 and check["ghost_instances"] == 0:
            return loop.time() - t0
        if loop.time() - t0 >= within_s:
            return None
        await asyncio.sleep(0.1)  # polling a cluster-wide view nothing pushes


async def _metric(address: str, name: str) -> float:
    """The value of an unlabelled metric on a component's /metrics (0 if absent)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2.0)
    try:
        writer.write(f"GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        body = await asyncio.wait_for(reader.read(), 2.0)
    finally:
        writer.close()
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def metric_sum(sup: Supervisor, prefixes: tuple[str, ...], name: str) -> int:
    """An unlabelled metric summed over the running children whose names
    start with one of prefixes (one that does not answer counts 0)."""
    total = 0.0
    for c in list(sup.children):
        if c.name.startswith(prefixes) and c.ready.get("metrics"):
            with contextlib.suppress(OSError, TimeoutError, ValueError):
                total += await _metric(c.ready["metrics"], name)
    return int(total)


async def pending_writes(sup: Supervisor) -> int:
    """Records queued for the store and not yet written, over the
    components that write behind (Dispatch, ClusterMgr)."""
    return await metric_sum(sup, ("dispatch-", "clustermgr-"), "galaxy_store_pending_writes")


def scale_action_check(log: list[tuple[int, dict[str, Any]]]) -> dict[str, int]:
    """Whether any scale action was applied twice, from the leaders' action
    log (``ScaleLedger``: (store revision, record) pairs). Pure. Twice
    means an action id written more than once, or an action of an older
    term written after one of a newer term (a deposed leader acting after
    its successor took over)."""
    seen: set[str] = set()
    twice = stale = 0
    newest = -1
    for _, rec in sorted(log, key=lambda x: x[0]):
        aid, term = str(rec.get("action", "")), int(rec.get("term", 0))
        if aid:
            twice += aid in seen
            seen.add(aid)
        stale += term < newest
        newest = max(newest, term)
    return {
        "scale_actions": len(log),
        "scale_actions_applied_twice": twice,
        "scale_actions_after_a_newer_term": stale,
    }


def epoch_check(samples: list[tuple[str, int]]) -> dict[str, Any]:
    """Whether a membership epoch went backwards, from (source, epoch)
    samples in the order they were taken, each source on its own (pure).
    0 is "no membership yet" (a client before its first answer) and is not
    a step back from anything."""
    last: dict[str, int] = {}
    back: list[str] = []
    for source, epoch in samples:
        prev = last.get(source, 0)
        if epoch < prev:
            back.append(f"{source}: {prev} -> {epoch}")
        last[source] = max(prev, epoch)
    return {
        "epoch_samples": len(samples),
        "epochs_backwards": len(back),
        "epochs_backwards_first": back[:5],
    }


async def scale_actions(state_url: str) -> dict[str, Any]:
    """``scale_action_check`` of the action log in the run's etcd, and the
    log in brief ("ACTION KIND -> DESIRED (CODE, LEADER)", in order)."""
    store = open_store(state_url)
    try:
        kvs = await store.get_prefix(DEFAULT_PREFIX + "actions/")
    finally:
        await store.close()
    log = sorted(((kv.version, json.loads(kv.value)) for kv in kvs), key=lambda x: x[0])
    brief = [
        f"{r.get('action', '?')} {r.get('kind', '?')} -> {r.get('desired')} ({r.get('code')}, "
        f"{r.get('leader')})"
        for _, r in log
    ]
    return {**scale_action_check(log), "scale_action_log": brief}


def busiest_agent(agents: Mapping[str, Iterable[str]], routed_nodes: Iterable[str]) -> str | None:
    """The agent (name -> its node ids) hosting the most routed instances
    (one node id per instance Dispatch routes); None if none hosts any. A
    fault on it is one clients can feel, unlike one on an idle agent."""
    count: dict[str, int] = {}
    for node in routed_nodes:
        count[node] = count.get(node, 0) + 1
    best, most = None, 0
    for name, nodes in agents.items():
        n = sum(count.get(node, 0) for node in nodes)
        if n > most:
            best, most = name, n
    return best
