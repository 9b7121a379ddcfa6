"""Whether any registered node could ever place one instance of a spec
(pure): a deploy that none could (GPUs on a cluster without any, more
memory or CPU per instance than the largest node has) is refused with
FAILED_PRECONDITION naming the field and the largest node's figure, rather
than stored and then failing every start.

The rule, for a cluster whose nodes join after the control plane starts:
the controller judges against the nodes ClusterMgr knows at deploy time,
and with no node known it refuses nothing (a fresh `galaxy up` deploys
before its nodes registered). FAILED_PRECONDITION, not INVALID_ARGUMENT:
the spec is valid and would be placed once a larger node joins.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.runtime.errors import FailedPrecondition
from galaxy.v1 import common_pb2

#: Checked in this order: the first one no node has enough of is named.
FIELDS = ("gpus", "memory_mib", "cpu_millis")


def fits(need: common_pb2.Resources, node: common_pb2.Resources) -> bool:
    """Whether an empty node of this capacity holds one instance."""
    return all(getattr(need, f) <= getattr(node, f) for f in FIELDS)


def total(nodes: Sequence[common_pb2.Resources]) -> common_pb2.Resources | None:
    """The nodes' summed capacity, None when no node is known."""
    if not nodes:
        return None
    return common_pb2.Resources(
        cpu_millis=sum(n.cpu_millis for n in nodes),
        memory_mib=sum(n.memory_mib for n in nodes),
        gpus=sum(n.gpus for n in nodes),
    )


def check_placeable(spec: common_pb2.FunctionSpec, nodes: Sequence[common_pb2.Resources]) -> None:
    """Raise FAILED_PRECONDITION if none of nodes (their capacities) could
    hold one instance of spec; nothing is refused when nodes is empty."""
    need = spec.resources
    if not nodes or any(fits(need, n) for n in nodes):
        return
    count = f"{len(nodes)} registered node{'s' if len(nodes) != 1 else ''}"
    for f in FIELDS:
        largest = max(getattr(n, f) for n in nodes)
        if getattr(need, f) > largest:
            raise FailedPrecondition(
                f"resources.{f}: {getattr(need, f)} per instance, but the largest of the "
                f"{count} has {largest}; no node could ever place it"
            )
    # Each figure fits some node, but no node has them all at once.
    raise FailedPrecondition(
        f"resources: no one of the {count} has cpu_millis {need.cpu_millis}, memory_mib "
        f"{need.memory_mib} and gpus {need.gpus} together; no node could ever place it"
    )
