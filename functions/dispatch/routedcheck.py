"""Dispatch's side of the orphan checks: "routed here, but its node agent
does not run it". An instance whose agent restarted (or lost it) without
the node being declared dead would stay routable and fail every request
sent to it; each period, Dispatch asks the agents of the nodes it routes
to for what they run (``ListNodeInstances``) and unroutes the instances
they do not list (a replacement starts when waiters need one).

``ghosts`` decides, purely; ``coordination.check_routed`` asks the agents
and performs (``Ownership.instance_gone``). Node agents run the other
direction ("running, nobody routes it": ``controlplane/nodeagent/orphans.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter

#: How often Dispatch compares what it routes with what the agents run:
#: a ghost is routed for at most about this long.
CHECK_S = 5.0
#: An instance routed more recently than this is not judged (its agent's
#: answer may predate it).
GRACE_S = 2.0
ROUTED_NOT_RUNNING = Counter(
    "galaxy_dispatch_routed_not_running_total",
    "Instances Dispatch routed that their node agent did not run (a restarted "
    "agent's predecessor's, or lost): unrouted by the periodic check",
)


@dataclass(frozen=True)
class Routed:
    """One routed instance, as the check sees it."""

    function: str
    instance_id: str
    node_id: str
    added_at: float


def ghosts(
    routed: Iterable[Routed], running: Mapping[str, set[str] | None], now: float
) -> list[Routed]:
    """The routed instances their node's agent does not run: ``running``
    gives each node's instance ids (None: the agent did not answer, which
    proves nothing: node death is ClusterMgr's call). Instances routed less
    than ``GRACE_S`` ago are not judged."""
    out: list[Routed] = []
    for r in routed:
        ids = running.get(r.node_id)
        if ids is not None and r.instance_id not in ids and now - r.added_at >= GRACE_S:
            out.append(r)
    return out
