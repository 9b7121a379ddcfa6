"""Prometheus metrics shared by every Galaxy process.

Each process serves its registry on an HTTP /metrics endpoint (see
``serve_metrics``). Names follow Prometheus conventions: ``galaxy_`` prefix,
base units (seconds), ``_total`` for counters.

The families here are created unregistered; a process registers the common
ones and those of its own kind (``register_component``), so a node agent does
not export Dispatch's credits as a misleading 0. Labelled counters start with
a series for each known label value (a rate over a counter that appears only
at its first event misses that event). Families defined in a component's own
package are registered when that module is imported, which only that
component's process does.
"""

from __future__ import annotations

import gc
import socket
import socketserver
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from controlplane.runtime import version as _version
from controlplane.runtime.netaddr import join_host_port

# Latency buckets from 100 us to 10 s: dispatch is sub-millisecond when warm,
# a process cold start is ~100 ms, a model load can take seconds.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# Scheduling latency (a policy decision, plus probes when it needs them) is
# read for tail quantiles by the bench and the simulator's fidelity check:
# finer buckets from 25 us to 1 s keep the interpolation error small there.
SCHEDULING_BUCKETS = (
    0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003,
    0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip

RPC_REQUESTS = Counter(
    "galaxy_rpc_requests_total",
    "gRPC requests handled, by method and status code.",
    ["method", "code"],
    registry=None,
)
RPC_LATENCY = Histogram(
    "galaxy_rpc_latency_seconds",
    "gRPC handler latency, by method.",
    ["method"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
SCHEDULING_LATENCY = Histogram(
    "galaxy_scheduling_latency_seconds",
    "From a start's request to its placement decision: in Schedule for the "
    "starts it places, in Dispatch for those a capacity credit places.",
    buckets=SCHEDULING_BUCKETS,
    registry=None,
)
PROBE_ROUND_TRIP = Histogram(
    "galaxy_probe_round_trip_seconds",
    "Schedule: from sending a round of probes to having every answer (the "
    "part of scheduling latency spent waiting on node agents).",
    buckets=SCHEDULING_BUCKETS,
    registry=None,
)
NODES = Gauge("galaxy_nodes", "Nodes known to this process.", ["state"], registry=None)
HEARTBEAT_STREAMS = Gauge(
    "galaxy_heartbeat_streams",
    "ClusterMgr: open node heartbeat streams (ClusterMgr.Heartbeats or HeartbeatBatches, "
    "one per node agent).",
    registry=None,
)
HEARTBEAT_BATCH_STATUSES = Histogram(
    "galaxy_heartbeat_batch_statuses",
    "ClusterMgr: statuses per HeartbeatBatches message (the nodes of one agent due together).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=None,
)
NODE_RESTARTS = Counter(
    "galaxy_node_restarts_total",
    "ClusterMgr: node agents that registered with a new incarnation (their "
    "previous life's instances were ended at once).",
    registry=None,
)
PROBES = Counter(
    "galaxy_probes_total", "Probe RPCs sent by Schedule to node agents.", registry=None
)
#: The configured bound of each bounded queue, labelled with the name of the
#: gauge that reports its depth, so saturation is depth / limit in PromQL
#: (deploy/monitoring/galaxy-rules.yaml, galaxy:queue_saturation:ratio).
QUEUE_LIMIT = Gauge(
    "galaxy_queue_limit",
    "Configured bound of a bounded queue; queue names the gauge of its depth.",
    ["queue"],
    registry=None,
)


class _BuildInfo(Collector):
    """``galaxy_build_info{version,commit} 1``: which build a process runs
    (mixed versions during a rolling upgrade show as two series). The commit
    is looked up at the first scrape, not at import, to keep starts fast."""

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            "galaxy_build_info",
            "Galaxy build this process runs (value 1).",
            labels=["version", "commit"],
        )
        family.add_metric([_version.version(), _version.commit()], 1)
        yield family


_BUILD_INFO = _BuildInfo()


# Pauses of Python's cycle collector: tens of microseconds for the young
# generation, milliseconds or more for a full collection of a large heap.
GC_PAUSE_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
GC_PAUSE = Histogram(
    "galaxy_gc_pause_seconds",
    "Pauses of Python's garbage collector (every thread of the process stops), "
    "by generation collected.",
    ["generation"],
    buckets=GC_PAUSE_BUCKETS,
    registry=None,
)
_gc_started = 0.0


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    elif _gc_started:
        GC_PAUSE.labels(str(info.get("generation", "?"))).observe(time.perf_counter() - _gc_started)
        _gc_started = 0.0


def watch_gc() -> None:
    """Time every garbage collection into ``galaxy_gc_pause_seconds``. A
    collection stops the whole process, so its pauses are a tail latency of
    every request the process is serving (idempotent)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


class _MetricsServer(ThreadingWSGIServer):
    """prometheus_client's threaded WSGI server, minus a reverse DNS lookup.

    http.server's ``server_bind`` resolves the bound address to a name
    (``socket.getfqdn``) only to fill ``server_name``; on a host whose
    resolver does not answer (a fresh network namespace, an air-gapped node)
    that stalls start-up for 10 s. Nothing here uses the name.
    """

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


def serve_metrics(host: str, port: int) -> str:
    """Start the /metrics HTTP endpoint in a daemon thread; returns the bound
    host:port (IPv6 literals in brackets)."""
    host = host.strip("[]")

    class Server(_MetricsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, make_wsgi_app(), Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return join_host_port(host, httpd.server_port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would drown the component's log


# The gateway's slot cache (controlplane/gateway/slots.py): requests served
# on a held lease (hit) or after a Dispatch call (miss), and leases held idle
# between requests now.
SLOT_CACHE = Counter(
    "galaxy_gateway_slot_cache_total",
    "Gateway requests served on a held lease (hit) or after a Dispatch call (miss)",
    ["result"],
    registry=None,
)
HELD_SLOTS = Gauge(
    "galaxy_gateway_held_slots", "Leases the gateway holds idle for the next request", registry=None
)


# Overload of Schedule and the node agent, named like Dispatch's
# (galaxy_dispatch_waiting, galaxy_dispatch_rejected_total): what waits now,
# and what was refused with RESOURCE_EXHAUSTED because its queue was full.
SCHEDULE_PENDING = Gauge(
    "galaxy_schedule_pending",
    "Placements in progress on this Schedule instance (bounded by --max-pending).",
    registry=None,
)
SCHEDULE_REJECTED = Counter(
    "galaxy_schedule_rejected_total",
    "Schedule calls refused with RESOURCE_EXHAUSTED, by reason (queue_full).",
    ["reason"],
    registry=None,
)
NODEAGENT_PENDING = Gauge(
    "galaxy_nodeagent_pending_creates",
    "CreateInstance calls whose instance is still starting (bounded by --max-starting).",
    registry=None,
)
NODEAGENT_LAUNCH_WAITING = Gauge(
    "galaxy_nodeagent_launches_waiting",
    "Instance starts waiting for a launch slot (at most --max-launching sandboxes "
    "are launched and awaited at once).",
    registry=None,
)
NODEAGENT_REJECTED = Counter(
    "galaxy_nodeagent_rejected_total",
    "CreateInstance calls refused with RESOURCE_EXHAUSTED, by reason (queue_full).",
    ["reason"],
    registry=None,
)


# Capacity credits of a Dispatch instance (functions/dispatch/credits.py):
# what it holds, and what happened to the starts that asked its wallet.
DISPATCH_CREDITS_HELD = Gauge(
    "galaxy_dispatch_credits_held", "Capacity credits this Dispatch instance holds.", registry=None
)
DISPATCH_CREDIT_EVENTS = Counter(
    "galaxy_dispatch_credit_events_total",
    "Credit outcomes of this Dispatch instance: hits (a start created from a credit), misses "
    "(none fitted: the start went through Schedule), refused, failed, granted, returned, dropped.",
    ["event"],
    registry=None,
)


NODEAGENT_INSTANCES = Gauge(
    "galaxy_nodeagent_instances",
    "Instances this node agent runs (ready), whoever routes to them.",
    registry=None,
)

#: Families every process exports.
COMMON: tuple[Collector, ...] = (RPC_REQUESTS, RPC_LATENCY, GC_PAUSE, QUEUE_LIMIT)
#: Families by the kind of process that owns them.
OWNED: dict[str, tuple[Collector, ...]] = {
    # Dispatch places every start that uses a capacity credit itself.
    "dispatch": (
        DISPATCH_CREDITS_HELD, DISPATCH_CREDIT_EVENTS, SCHEDULING_LATENCY,
    ),
    "schedule": (
        SCHEDULING_LATENCY, PROBE_ROUND_TRIP, PROBES, NODES, SCHEDULE_PENDING, SCHEDULE_REJECTED,
    ),
    "clustermgr": (NODES, HEARTBEAT_STREAMS, HEARTBEAT_BATCH_STATUSES, NODE_RESTARTS),
    "nodeagent": (
        NODEAGENT_INSTANCES, NODEAGENT_PENDING, NODEAGENT_LAUNCH_WAITING, NODEAGENT_REJECTED,
    ),
    "gateway": (SLOT_CACHE, HELD_SLOTS),
    "controller": (),
    "supervisor": (),
}  # fmt: skip
#: Label values known in advance, given a zero series at registration.
KNOWN_LABELS: dict[Collector, tuple[tuple[str, ...], ...]] = {
    SCHEDULE_REJECTED: (("queue_full",),),
    NODEAGENT_REJECTED: (("queue_full",),),
    SLOT_CACHE: (("hit",), ("miss",)),
    DISPATCH_CREDIT_EVENTS: tuple(
        (e,) for e in ("hit", "miss", "refused", "failed", "granted", "returned", "dropped")
    ),
}
_registered: set[int] = set()


def ensure_registered(*collectors: Collector) -> None:
    """Register each collector with the default registry once (idempotent),
    giving its known label values a zero series."""
    for c in collectors:
        if id(c) in _registered:
            continue
        REGISTRY.register(c)
        _registered.add(id(c))
        for values in KNOWN_LABELS.get(c, ()):
            c.labels(*values)  # type: ignore[attr-defined]


def register_component(kind: str) -> None:
    """Export the common families and those ``kind`` owns (and the build
    info). Unknown kinds (a CLI command) get the common ones."""
    ensure_registered(_BUILD_INFO, *COMMON, *OWNED.get(kind, ()))


def register_all() -> None:
    """Every family: for a process that hosts every component (the tests)."""
    ensure_registered(_BUILD_INFO, *COMMON, *(c for cs in OWNED.values() for c in cs))
