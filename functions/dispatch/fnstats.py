"""Per-function metrics of a Dispatch instance (``runtime.fnmetrics``): every
dispatch it serves by namespace, function, revision and gRPC code, with its
latency (SDK calls and the gateway's slot misses alike, unary or on a
stream); its instances by revision and state, read at scrape time (this
instance owns the functions it routes, so each instance is counted once
across Dispatch instances); and cold starts with honest labels (the
function's name, its revision)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from controlplane.runtime import fnmetrics, revisions
from controlplane.runtime.errors import GalaxyError
from galaxy.v1 import common_pb2, dispatch_pb2

S = TypeVar("S")
Handler = Callable[[S, dispatch_pb2.DispatchRequest, Any], Awaitable[dispatch_pb2.InstanceAddr]]
METRICS = fnmetrics.FunctionMetrics("dispatch")


def init_reasons(rejected: Any) -> None:
    """A zero series for each reason Dispatch refuses for (known in advance)."""
    for reason in ("queue_full", "wait_timeout", "deadline_too_short"):
        rejected.labels(reason)


def namespace_of(specs: dict[str, common_pb2.FunctionSpec], name: str) -> str:
    """The namespace of a function or revision whose spec is cached ("" if not)."""
    spec = specs.get(name)
    return spec.namespace if spec is not None else ""


def recorded(method: Handler[S]) -> Handler[S]:
    """Wrap ``DispatchServicer.Dispatch``: time it, set the reply's
    namespace, and count it where it was served (not where it was forwarded
    from: a forwarding hop records nothing, the owner records it)."""

    @functools.wraps(method)
    async def dispatch(
        self: Any, request: dispatch_pb2.DispatchRequest, context: Any
    ) -> dispatch_pb2.InstanceAddr:
        t0 = time.perf_counter()
        d = self.dispatcher
        served = request.forwarded or d.owner(request.function) is None
        code, rev, ns = "OK", "", ""
        try:
            addr = await method(self, request, context)
            rev = addr.function
            addr.namespace = ns = namespace_of(d.specs, request.function)
            return addr
        except GalaxyError as e:
            code = e.code.name
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            if served and request.function:
                ns = ns or namespace_of(d.specs, request.function)
                METRICS.dispatch(ns, request.function, rev, code, time.perf_counter() - t0)

    return dispatch


def instance_rows(
    routers: dict[str, Any], specs: dict[str, common_pb2.FunctionSpec]
) -> Iterator[tuple[str, str, str, str, int]]:
    """(namespace, function, revision, state, count) of this Dispatch's routers."""
    for name, router in list(routers.items()):
        function = revisions.split(name)[0]
        ns = namespace_of(specs, name) or namespace_of(specs, function)
        draining = sum(1 for i in router.instances.values() if i.draining)
        rows = (("ready", len(router.instances) - draining), ("draining", draining),
                ("starting", router.pending))  # fmt: skip
        for state, n in rows:
            if n:
                yield ns, function, name, state, n


def cold_start(spec: common_pb2.FunctionSpec) -> None:
    """A start asked for an instance of the revision ``spec`` describes."""
    METRICS.cold_start(spec.namespace, revisions.split(spec.name)[0], spec.name)


def cold_start_ready(spec: common_pb2.FunctionSpec, seconds: float) -> None:
    """A started instance of that revision became ready after ``seconds``."""
    METRICS.cold_start_ready(spec.namespace, revisions.split(spec.name)[0], spec.name, seconds)


_SOURCES: dict[int, fnmetrics.InstanceRows] = {}


def attach(svc: Any) -> None:
    """Count ``svc``'s instances in ``galaxy_function_instances``."""

    def rows() -> Iterator[tuple[str, str, str, str, int]]:
        return instance_rows(svc.routers, svc.spec_cache.specs)

    _SOURCES[id(svc)] = rows
    fnmetrics.FUNCTION_INSTANCES.sources.append(rows)


def detach(svc: Any) -> None:
    """Stop counting a closed servicer's instances."""
    rows = _SOURCES.pop(id(svc), None)
    if rows is not None and rows in fnmetrics.FUNCTION_INSTANCES.sources:
        fnmetrics.FUNCTION_INSTANCES.sources.remove(rows)
