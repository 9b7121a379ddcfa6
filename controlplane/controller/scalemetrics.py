"""Prometheus metrics of control function scaling (served by the controller).

The same figures `galaxy status` prints: per kind the instances, load, T,
utilization and desired count, and a counter of scale actions by reason code.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from controlplane.runtime.metrics import LATENCY_BUCKETS

INSTANCES = Gauge(
    "galaxy_control_instances",
    "Control function instances by kind and state (ready, warming, draining, standby).",
    ["kind", "state"],
)
DESIRED = Gauge("galaxy_control_desired_instances", "Instances the controller scales to.", ["kind"])
LOAD = Gauge(
    "galaxy_control_load_ops_per_second",
    "Summed rate of the kind's critical operation (dispatch, SRPS, node updates).",
    ["kind"],
)
CAPACITY = Gauge(
    "galaxy_control_capacity_ops_per_second",
    "T: maximum rate one instance of the kind sustains (T_DF, T_SF, T_CMF).",
    ["kind"],
)
UTILIZATION = Gauge(
    "galaxy_control_utilization", "load / (ready instances x T), by kind.", ["kind"]
)
QUEUE = Gauge("galaxy_control_queue_depth", "Summed queue depth reported, by kind.", ["kind"])
ACTIONS = Counter(
    "galaxy_control_scale_actions_total",
    "Scale actions committed, by kind, direction (out/in) and reason code.",
    ["kind", "direction", "code"],
)
SCALE_OUT_SECONDS = Histogram(
    "galaxy_control_scale_out_seconds",
    "From a scale-out decision until the new instances take traffic.",
    ["kind"],
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0),
)
STANDBY_PROMOTED = Counter(
    "galaxy_control_standby_promoted_total",
    "Warm standbys promoted by a scale-out (no process start on its path).",
    ["kind"],
)
LEADER = Gauge("galaxy_controller_leader", "1 while this controller leads, else 0.")
