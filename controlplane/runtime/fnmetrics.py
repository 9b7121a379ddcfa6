"""Per-function metrics, with bounded cardinality.

Requests, errors and latency by ``namespace``, ``function``, ``revision`` and
``code`` at the gateway (every request that entered there, slot-cache hits
included) and at Dispatch (every dispatch: SDK calls, and the gateway's
requests that needed a slot); instances by function, revision and state from
Dispatch only (the owner of a function counts its instances once, so a
``sum()`` over every process is the real number); cold starts and their
latency by function and revision.

Each label value set is admitted by ``LabelBudget``: at most
``max_functions`` (namespace, function) pairs per process get series of
their own; the ones after that are counted under ``function="_other"``
(and ``namespace``/``revision`` ``_other``), never dropped, and
``galaxy_metric_label_overflow_total`` says how many observations went
there. A function admitted once keeps its series (no eviction: a series
that comes and goes breaks ``rate()``). The default matches the
controller's default ``--max-functions`` (500), so a default cluster never
aggregates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.runtime.metrics import LATENCY_BUCKETS, ensure_registered

OTHER = "_other"
DEFAULT_MAX_FUNCTIONS = 500


class LabelBudget:
    """Which (namespace, function) pairs get their own series (pure)."""

    def __init__(self, max_functions: int = DEFAULT_MAX_FUNCTIONS) -> None:
        if max_functions < 1:
            raise ValueError("max_functions must be at least 1")
        self.max_functions = max_functions
        self._admitted: set[tuple[str, str]] = set()
        #: Observations recorded under _other.
        self.overflowed = 0

    def labels(self, namespace: str, function: str, revision: str) -> tuple[str, str, str]:
        """The label values to record under (``_other`` past the budget)."""
        key = (namespace or "default", function)
        if key in self._admitted:
            return key[0], key[1], revision
        if len(self._admitted) < self.max_functions:
            self._admitted.add(key)
            return key[0], key[1], revision
        self.overflowed += 1
        return OTHER, OTHER, OTHER


FN = ["namespace", "function", "revision"]
FUNCTION_REQUESTS = Counter(
    "galaxy_function_requests_total",
    "Gateway: requests to a function by HTTP status (slot-cache hits included).",
    [*FN, "code"],
    registry=None,
)
FUNCTION_REQUEST_SECONDS = Histogram(
    "galaxy_function_request_seconds",
    "Gateway: a function's request time to the last byte.",
    FN,
    buckets=LATENCY_BUCKETS,
    registry=None,
)
DISPATCH_REQUESTS = Counter(
    "galaxy_dispatch_requests_total",
    "Dispatch: dispatches of a function by gRPC status (SDK calls and gateway slot misses).",
    [*FN, "code"],
    registry=None,
)
DISPATCH_SECONDS = Histogram(
    "galaxy_dispatch_request_seconds",
    "Dispatch: from a dispatch request to its grant or refusal (waiting for a slot included).",
    FN,
    buckets=LATENCY_BUCKETS,
    registry=None,
)
COLD_STARTS = Counter(
    "galaxy_cold_starts_total",
    "Dispatch: instances started because a request found no free one.",
    FN,
    registry=None,
)
COLD_START_SECONDS = Histogram(
    "galaxy_cold_start_latency_seconds",
    "Dispatch: from a scale-up trigger to the instance ready.",
    FN,
    buckets=LATENCY_BUCKETS,
    registry=None,
)
LABEL_OVERFLOW = Counter(
    "galaxy_metric_label_overflow_total",
    "Observations recorded under function=_other because the per-process label budget "
    "(500 functions, the controller's default --max-functions) was spent.",
    ["family"],
    registry=None,
)

#: (namespace, function, revision, state, count) rows of one Dispatch.
InstanceRows = Callable[[], Iterable[tuple[str, str, str, str, int]]]


class FunctionInstances(Collector):
    """``galaxy_function_instances{namespace,function,revision,state}``,
    read at scrape time from the Dispatch servicers of this process (one in
    production; several when a test hosts a cluster in one process)."""

    def __init__(self, budget: LabelBudget) -> None:
        self.budget = budget
        self.sources: list[InstanceRows] = []

    def source(self) -> Iterable[tuple[str, str, str, str, int]]:
        """Every source's rows."""
        for src in list(self.sources):
            yield from src()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "galaxy_function_instances",
            "Instances of a function by revision and state (starting, ready, draining), "
            "from the Dispatch instance that owns the function (counted once).",
            labels=[*FN, "state"],
        )
        totals: dict[tuple[str, str, str, str], int] = {}
        for ns, fn, rev, state, n in self.source():
            key = (*self.budget.labels(ns, fn, rev), state)
            totals[key] = totals.get(key, 0) + n
        for key, n in sorted(totals.items()):
            family.add_metric(list(key), n)
        yield family


#: One label budget per process, shared by every family here.
BUDGET = LabelBudget()
FUNCTION_INSTANCES = FunctionInstances(BUDGET)


class FunctionMetrics:
    """What a gateway or a Dispatch records per function; registers the
    families of its role (``gateway`` or ``dispatch``) on creation."""

    def __init__(self, role: str) -> None:
        self.budget = BUDGET
        ensure_registered(*(GATEWAY_FAMILIES if role == "gateway" else DISPATCH_FAMILIES))
        if role == "dispatch":
            ensure_registered(FUNCTION_INSTANCES)

    def _labels(self, family: str, ns: str, fn: str, rev: str) -> tuple[str, str, str]:
        before = self.budget.overflowed
        labels = self.budget.labels(ns, fn, rev)
        if self.budget.overflowed != before:
            LABEL_OVERFLOW.labels(family).inc()
        return labels

    def gateway_request(self, ns: str, fn: str, rev: str, code: int, seconds: float) -> None:
        """One request through the gateway, finished."""
        labels = self._labels("galaxy_function_requests_total", ns, fn, rev)
        FUNCTION_REQUESTS.labels(*labels, str(code)).inc()
        FUNCTION_REQUEST_SECONDS.labels(*labels).observe(seconds)

    def dispatch(self, ns: str, fn: str, rev: str, code: str, seconds: float) -> None:
        """One dispatch, granted (``OK``) or refused (the gRPC code's name)."""
        labels = self._labels("galaxy_dispatch_requests_total", ns, fn, rev)
        DISPATCH_REQUESTS.labels(*labels, code).inc()
        DISPATCH_SECONDS.labels(*labels).observe(seconds)

    def cold_start(self, ns: str, fn: str, rev: str) -> None:
        """A start triggered (counted when it is asked for)."""
        COLD_STARTS.labels(*self._labels("galaxy_cold_starts_total", ns, fn, rev)).inc()

    def cold_start_ready(self, ns: str, fn: str, rev: str, seconds: float) -> None:
        """A started instance became ready after ``seconds``."""
        labels = self._labels("galaxy_cold_start_latency_seconds", ns, fn, rev)
        COLD_START_SECONDS.labels(*labels).observe(seconds)


GATEWAY_FAMILIES: tuple[Collector, ...] = (
    FUNCTION_REQUESTS,
    FUNCTION_REQUEST_SECONDS,
    LABEL_OVERFLOW,
)
DISPATCH_FAMILIES: tuple[Collector, ...] = (
    DISPATCH_REQUESTS,
    DISPATCH_SECONDS,
    COLD_STARTS,
    COLD_START_SECONDS,
    LABEL_OVERFLOW,
)
