"""What `galaxy chaos` checks in a control plane after a fault: duplicate
and leaked instances (GetClusterStatus) and the write-behind backlog (the
components' /metrics)."""

from __future__ import annotations

import asyncio
import contextlib

from controlplane.launch.up import Supervisor
from controlplane.sdk.client import GalaxyClient


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
    return {
        "instances": len(ids),
        "duplicate_instances": len(ids) - len(set(ids)),
        "leaked_instances": leaked,
        "nodes_alive": sum(1 for n in st.nodes if n.alive),
    }


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


async def pending_writes(sup: Supervisor) -> int:
    """Records queued for the store and not yet written, over the
    components that write behind (Dispatch, ClusterMgr)."""
    total = 0.0
    for c in list(sup.children):
        if c.name.startswith(("dispatch-", "clustermgr-")) and c.ready.get("metrics"):
            with contextlib.suppress(OSError, TimeoutError, ValueError):
                total += await _metric(c.ready["metrics"], "galaxy_store_pending_writes")
    return int(total)
