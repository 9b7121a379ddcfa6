"""Revisions on a Dispatch instance: which revision serves a request, the
start of a new revision's first instance during a rollout, and retiring the
instances of revisions that no longer get traffic.

The decisions are the pure functions of ``controlplane.runtime.revisions``;
this module reads the servicer's routers and performs what they decide. Each
revision is routed by a ``FunctionRouter`` of its own, named NAME-NNNNN.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from controlplane.runtime import authn, revisions
from functions.dispatch.policy import FunctionRouter
from galaxy.v1 import common_pb2, dispatch_pb2

if TYPE_CHECKING:
    from functions.dispatch.dispatcher import Dispatcher

log = logging.getLogger(__name__)


def _ready(d: Dispatcher, function: str) -> Callable[[int], bool]:
    def ready(rev: int) -> bool:
        r = d.routers.get(revisions.revision_name(function, rev))
        return r is not None and r.live_count() > 0

    return ready


def _no_hold() -> float:
    return 0.0


async def resolve(
    d: Dispatcher, request: dispatch_pb2.DispatchRequest
) -> tuple[common_pb2.FunctionSpec, FunctionRouter, Callable[[], float]]:
    """The spec and router that serve one request for ``request.function``
    (a function, or a revision name that pins one revision), and what to
    call once its slot is granted: the seconds its caller may hold the
    lease for later requests (``FunctionRouter.hold``; 0 when the request
    did not ask, the revision was drawn from a split, or the function is an
    LLM's: its picker places every request, and a held lease would pin the
    caller to one instance)."""
    function, tag = request.function, request.tag
    spec = await d.spec(function)
    # Before anything starts: a caller of another namespace gets nothing.
    authn.ensure_invoke(spec.namespace, spec.public, f"function {function}")
    wants = request.hold and not spec.llm
    if not spec.revision or revisions.split(function)[1]:
        # No revisions (older records), or pinned: nothing is drawn.
        router = d.router(spec)
        return spec, router, _holder(d, function, spec, router) if wants else _no_hold
    ready = _ready(d, function)
    rev = revisions.choose(spec, tag, random.random(), ready)
    rev_spec = await d.spec(revisions.revision_name(function, rev))
    router = d.router(rev_spec)
    if rev != spec.revision and not tag:
        await _warm_latest(d, spec)
    hold = wants and revisions.settled(spec, tag, ready)
    return rev_spec, router, _holder(d, function, spec, router) if hold else _no_hold


def _holder(
    d: Dispatcher, function: str, spec: common_pb2.FunctionSpec, router: FunctionRouter
) -> Callable[[], float]:
    """The hold of a grant chosen under spec: none once the spec was replaced
    (a change of split or a new revision: see ``holds_lapse``)."""

    def hold() -> float:
        return router.hold() if d.specs.get(function) is spec else 0.0

    return hold


async def holds_lapse(d: Dispatcher, function: str) -> None:
    """Return once no lease held under function's current spec can take a
    new request (bounded by ``FunctionRouter.hold_s``), with holds closed
    meanwhile; call right before replacing the spec. A change of split or a
    new revision then never reaches a request through a held slot of the
    revision chosen before it. (A wait on a time bound: holders stop at
    their hold's end, and nothing is sent to say so.)"""
    closed: dict[int, FunctionRouter] = {}  # by identity (routers compare by value)
    try:
        while True:
            # Again after each wait: a revision may have been routed meanwhile.
            for n, r in d.routers.items():
                if revisions.routing_key(n) == function and id(r) not in closed:
                    r.close_holds()
                    closed[id(r)] = r
            left = max((r.holds_left() for r in closed.values()), default=0.0)
            if left <= 0:
                return
            await asyncio.sleep(left)
    finally:
        for r in closed.values():
            r.open_holds()


async def _warm_latest(d: Dispatcher, spec: common_pb2.FunctionSpec) -> None:
    """Start the latest revision's first instance while an older one serves
    (traffic moves to it once it is ready: a rollout without cold starts)."""
    latest = await d.spec(revisions.revision_name(spec.name, spec.revision))
    router = d.router(latest)
    if router.live_count() == 0 and router.pending == 0:
        log.info("rolling out %s: starting its first instance", latest.name)
        d.start(router, latest, 1)


async def function_updated(d: Dispatcher, name: str) -> bool:
    """A new spec or traffic split of a function this instance owns, if it
    has revisions: route the revisions that now get traffic (so their
    min_scale instances start before any request) and warm the latest one
    while an older one serves. False when the caller's path applies (not
    the owner, or a function without revisions)."""
    if d.owner(name) is not None:
        return False
    spec = await d.spec(name)
    if not spec.revision:
        return False
    ready = _ready(d, name)
    for rev in sorted(revisions.routed(spec, ready)):
        d.router(await d.spec(revisions.revision_name(name, rev)))
    if revisions.latest_ready(spec.revision, ready) != spec.revision:
        await _warm_latest(d, spec)
    return True


def inactive(d: Dispatcher) -> set[str]:
    """Revision routers that get no new requests (no share, no tag, not the
    latest ready one): their idle instances retire at once, min_scale aside."""
    out: set[str] = set()
    for name in d.routers:
        function, rev = revisions.split(name)
        if not rev:
            continue
        spec = d.specs.get(function)
        if spec is None or not spec.revision:
            continue
        if rev not in revisions.routed(spec, _ready(d, function)):
            out.add(name)
    return out


def retire_inactive(d: Dispatcher, names: set[str]) -> None:
    """Retire idle instances of inactive revisions; drop emptied routers.
    Busy instances finish their requests first (no request is dropped)."""
    for name in names:
        router = d.routers[name]
        for iid, inst in list(router.instances.items()):
            if inst.in_flight == 0:
                router.drain(iid)
                gone = d.remove(router, iid)
                if gone is not None and gone.meta is not None:
                    log.info("retiring %s: revision %s gets no traffic", iid, name)
                    d.spawn(d.peers.delete_on_node(gone.meta))
        if not router.instances and not router.waiters and not router.pending:
            del d.routers[name]
            d.specs.pop(name, None)
