"""Prometheus metrics shared by every Galaxy process.

Each process serves its registry on an HTTP /metrics endpoint (see
``serve_metrics``). Names follow Prometheus conventions: ``galaxy_`` prefix,
base units (seconds), ``_total`` for counters.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# Latency buckets from 100 us to 10 s: dispatch is sub-millisecond when warm,
# a process cold start is ~100 ms, a model load can take seconds.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

RPC_REQUESTS = Counter(
    "galaxy_rpc_requests_total",
    "gRPC requests handled, by method and status code.",
    ["method", "code"],
)
RPC_LATENCY = Histogram(
    "galaxy_rpc_latency_seconds",
    "gRPC handler latency, by method.",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
COLD_STARTS = Counter(
    "galaxy_cold_starts_total",
    "Function instances started because a request found no free instance.",
    ["function"],
)
COLD_START_LATENCY = Histogram(
    "galaxy_cold_start_latency_seconds",
    "From scale-up trigger to instance ready, as seen by Dispatch.",
    buckets=LATENCY_BUCKETS,
)
SCHEDULING_LATENCY = Histogram(
    "galaxy_scheduling_latency_seconds",
    "From Schedule request to placement decision.",
    buckets=LATENCY_BUCKETS,
)
INSTANCES = Gauge(
    "galaxy_function_instances",
    "Function instances known to this process (Dispatch: routable; node agent: running).",
)
NODES = Gauge("galaxy_nodes", "Nodes known to this process.", ["state"])
PROBES = Counter("galaxy_probes_total", "Probe RPCs sent by Schedule to node agents.")


def serve_metrics(host: str, port: int) -> str:
    """Start the /metrics HTTP endpoint; returns the bound host:port."""
    server, _thread = start_http_server(port, addr=host)
    return f"{host}:{server.server_port}"
