"""Dispatch's coordination with the rest of the control plane: handing
functions over to their new owner after a membership change, dropping the
instances of a dead node, forgetting a deleted function, and listing what it
routes. The servicer calls these with itself; the routing decisions stay in
``FunctionRouter``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from controlplane.runtime.errors import InvalidArgument, NotFound
from controlplane.runtime.revisions import routing_key
from functions.dispatch.policy import Grant, Instance, Waiter
from galaxy.v1 import common_pb2, dispatch_pb2

if TYPE_CHECKING:
    from functions.dispatch.service import DispatchServicer

log = logging.getLogger(__name__)


class Moved(Exception):
    """A waiting request's function now belongs to another Dispatch instance."""

    def __init__(self, owner: common_pb2.ControlInstance) -> None:
        super().__init__(owner.id)
        self.owner = owner


def hand_over_moved(svc: DispatchServicer) -> None:
    """Give functions this instance no longer owns to their new owners.

    Order matters: the routing state is taken and dropped at once, the
    instances (with their reserved slots) are sent, and only then are
    waiting and newly arriving requests forwarded. Forwarding first would
    make the new owner cold-start an instance it is about to receive.
    """
    for name in list(svc.routers):
        owner = svc._owner(name)
        if owner is None:
            continue
        router = svc.routers.pop(name)
        moved = router.handover()
        waiters = router.fail_all()
        for inst, _ in moved:
            svc._remove(router, inst.instance_id)
        log.info(
            "function %s moved to dispatch %s: handing over %d instances",
            name,
            owner.id,
            len(moved),
        )
        done = asyncio.Event()
        svc._moving[name] = done
        svc._spawn(hand_over(svc, name, owner, moved, waiters, done))


async def hand_over(
    svc: DispatchServicer,
    name: str,
    owner: common_pb2.ControlInstance,
    moved: list[tuple[Instance, list[str]]],
    waiters: list[Waiter],
    done: asyncio.Event,
) -> None:
    try:
        await asyncio.gather(
            *(
                svc.peers.send_instance(owner, inst.meta, leases)
                for inst, leases in moved
                if inst.meta is not None
            )
        )
    finally:
        if svc._moving.get(name) is done:
            del svc._moving[name]
        done.set()
        for w in waiters:
            fut: asyncio.Future[Grant] = w.token
            if not fut.done():
                fut.set_exception(Moved(owner))


def node_dead(svc: DispatchServicer, node_id: str) -> None:
    """Stop routing to instances on a dead node; replace them for waiters."""
    for router in svc.routers.values():
        lost = [i for i, inst in router.instances.items() if inst.node_id == node_id]
        for iid in lost:
            svc._remove(router, iid)
        if lost:
            log.warning(
                "node %s is dead: dropped %d instances of %s", node_id, len(lost), router.name
            )
            spec = svc._specs.get(router.name)
            if spec is not None:
                svc._trigger_scale_up(router, spec)


def function_deleted(svc: DispatchServicer, name: str) -> None:
    """Forget a deleted function and its revisions; stop their instances."""
    for routed in [n for n in svc.routers if n == name or routing_key(n) == name] or [name]:
        _forget(svc, routed, name)


def _forget(svc: DispatchServicer, routed: str, name: str) -> None:
    svc._specs.pop(routed, None)
    router = svc.routers.pop(routed, None)
    if router is None:
        return
    for w in router.fail_all():
        fut: asyncio.Future[Grant] = w.token
        if not fut.done():
            fut.set_exception(NotFound(f"function {name!r} was deleted"))
    for inst in list(router.instances.values()):
        svc._remove(router, inst.instance_id)
        if inst.meta is not None:
            svc._spawn(svc.peers.delete_on_node(inst.meta))


async def recover(svc: DispatchServicer, records: list[common_pb2.InstanceInfo]) -> int:
    """Adopt instances recorded by a previous incarnation, after checking
    with their node agents that they still run; returns how many.

    The store may hold records of instances that died while no Dispatch
    was watching, so the node agents are the authority.
    """
    live, gone = await svc.peers.running(records)
    for info in live:
        svc._recovered.setdefault(info.function, []).append(info)
        # Under this process's lease now: the old one expires with its writer.
        svc.record(
            f"/galaxy/instances/{info.function}/{info.instance_id}", info.SerializeToString()
        )
    for info in gone:
        svc.record(f"/galaxy/instances/{info.function}/{info.instance_id}", None)
    return len(live)


async def mod_instance(
    svc: DispatchServicer, request: dispatch_pb2.ModInstanceRequest
) -> dispatch_pb2.ModInstanceReply:
    """An instance handed over by a peer (OP_ADD, with its active leases) or
    reported gone (OP_REMOVE)."""
    info = request.instance
    if not info.instance_id or not info.function:
        raise InvalidArgument("instance.instance_id and instance.function: required")
    router = svc.routers.get(info.function)
    if request.op == dispatch_pb2.ModInstanceRequest.OP_ADD:
        if not info.address:
            raise InvalidArgument("instance.address: required for OP_ADD")
        if router is None:
            router = svc._router(await svc._spec(info.function))
        changed = svc._add(router, info, cold=False)
        leases = [x for x in request.active_leases if x not in svc._released_unknown]
        router.adopt_leases(info.instance_id, leases)
        return dispatch_pb2.ModInstanceReply(changed=changed)
    if request.op == dispatch_pb2.ModInstanceRequest.OP_REMOVE:
        if router is None:
            return dispatch_pb2.ModInstanceReply(changed=False)
        log.info("instance %s removed: %s", info.instance_id, request.reason or "no reason")
        changed = svc._remove(router, info.instance_id) is not None
        # Waiters that counted on it may now need a new instance.
        spec = svc._specs.get(info.function)
        if changed and spec is not None:
            svc._trigger_scale_up(router, spec)
        return dispatch_pb2.ModInstanceReply(changed=changed)
    raise InvalidArgument("op: must be OP_ADD or OP_REMOVE")


def list_instances(
    svc: DispatchServicer, request: dispatch_pb2.ListInstancesRequest
) -> dispatch_pb2.ListInstancesReply:
    """What this instance routes: functions, their queues and instances."""
    out = dispatch_pb2.ListInstancesReply(dispatch_id=svc.instance_id)
    for name in sorted(svc.routers):
        if request.function and request.function not in (name, routing_key(name)):
            continue  # a function's filter takes in its revisions
        r = svc.routers[name]
        out.functions.append(
            dispatch_pb2.FunctionRouting(function=name, waiting=len(r.waiters), pending=r.pending)
        )
        for inst in r.instances.values():
            out.instances.append(
                dispatch_pb2.InstanceState(
                    instance=inst.meta, in_flight=inst.in_flight, draining=inst.draining
                )
            )
    return out
