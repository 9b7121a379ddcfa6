"""Autoscaling of function instances (the users' workloads).

``kpa``: a Knative-style concurrency autoscaler (stable and panic windows,
rate limits, min/max scale, scale to zero after a grace period);
``removal``: the choice of which idle instances to remove (also exported by
``kpa``). ``keepalive``: pluggable keep-alive
policies deciding how long the last instance stays (fixed, or the hybrid
histogram policy of "Serverless in the Wild", ATC'20). Pure policies with no
I/O; see docs/autoscaling.md.
"""

from functions.dispatch.autoscaling.keepalive import (
    FixedKeepAlive,
    HybridHistogramKeepAlive,
    KeepAlivePolicy,
    make_keepalive,
)
from functions.dispatch.autoscaling.kpa import (
    InstanceView,
    KpaAutoscaler,
    KpaConfig,
    RemovalCandidate,
    ScaleDecision,
    idle_instances_to_remove,
)

__all__ = [
    "FixedKeepAlive",
    "HybridHistogramKeepAlive",
    "InstanceView",
    "KeepAlivePolicy",
    "KpaAutoscaler",
    "KpaConfig",
    "RemovalCandidate",
    "ScaleDecision",
    "idle_instances_to_remove",
    "make_keepalive",
]
