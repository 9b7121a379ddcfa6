"""Dispatch's coordination with the rest of the control plane, as I/O:
the servicer's side of ``ownership.Ownership``. Each event (a membership
change, a dead node, a deleted function, a handed-over or exited instance,
a restart) goes to the pure ``Ownership`` core, and the actions it returns
are performed here, in order, with RPCs, store writes and futures. Also
lists what this instance routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from controlplane.runtime.errors import InvalidArgument, NotFound
from controlplane.runtime.revisions import routing_key
from functions.dispatch import llmsleep, revisions, routedcheck
from functions.dispatch import ownership as own
from functions.dispatch.policy import FunctionRouter, Grant, Instance, Waiter
from galaxy.v1 import common_pb2, dispatch_pb2

if TYPE_CHECKING:
    from functions.dispatch.dispatcher import Dispatcher

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH

log = logging.getLogger(__name__)


class Moved(Exception):
    """A waiting request's function now belongs to another Dispatch instance."""

    def __init__(self, owner: common_pb2.ControlInstance) -> None:
        super().__init__(owner.id)
        self.owner = owner


def perform(d: Dispatcher, actions: Iterable[own.Action]) -> None:
    """Carry out the core's actions, in the order given."""
    for a in actions:
        if isinstance(a, own.DropRoute):
            d.routers.pop(a.function, None)
            if a.deleted:
                d.specs.pop(a.function, None)
        elif isinstance(a, own.Unrouted):
            d.unrouted(a.function, a.instance.instance_id)
        elif isinstance(a, own.SendInstances):
            log.info(
                "function %s moved to dispatch %s: handing over %d instances",
                a.function,
                a.owner.id,
                len(a.instances),
            )
            d.spawn(_send_instances(d, a))
        elif isinstance(a, own.Serve):
            d.wake(a.grants)
        elif isinstance(a, own.ForwardWaiters):
            _fail(a.waiters, Moved(a.owner))
        elif isinstance(a, own.FailWaiters):
            _fail(a.waiters, NotFound(a.reason))
        elif isinstance(a, own.DeleteOnNode):
            if a.instance.meta is not None:
                d.spawn(d.peers.delete_on_node(a.instance.meta))
        elif isinstance(a, own.ScaleUp):
            router, spec = d.routers.get(a.function), d.specs.get(a.function)
            if router is not None and spec is not None:
                d.trigger_scale_up(router, spec)
        elif isinstance(a, own.Record):
            key = f"/galaxy/instances/{a.function}/{a.instance_id}"
            d.record(key, None if a.value is None else a.value.SerializeToString())


def _fail(waiters: list[Waiter], err: Exception) -> None:
    for w in waiters:
        fut: asyncio.Future[Grant] = w.token
        if not fut.done():
            fut.set_exception(err)


async def _send_instances(d: Dispatcher, a: own.SendInstances[str, Any]) -> None:
    try:
        await asyncio.gather(
            *(
                d.peers.send_instance(a.owner, inst.meta, leases)
                for inst, leases in a.instances
                if inst.meta is not None
            )
        )
    finally:
        # Only now may the held requests go: see ``ownership``.
        perform(d, d.ownership.instances_sent(a.handover))


def late_start_done(
    d: Dispatcher, router: FunctionRouter, info: common_pb2.InstanceInfo
) -> list[str]:
    """A start ``router`` asked for is ready after ``router`` was handed over:
    it serves the waiters kept for it (see ``ownership``). Returns the leases
    it now carries, to go with it to whoever routes the function now."""
    conc = info.concurrency or router.concurrency
    inst = Instance(info.instance_id, info.address, info.node_id, conc, meta=info)
    actions, leases = d.ownership.start_done(router.name, router, inst)
    perform(d, actions)
    return leases


def late_start_failed(d: Dispatcher, router: FunctionRouter) -> bool:
    """A start ``router`` asked for failed after ``router`` was handed over:
    the waiters no start covers any more go to the owner (this instance
    too, when the function came back: they queue on its new router).
    False when no owner is known (the caller fails them)."""
    owner = d.membership.owner(DISPATCH, routing_key(router.name))
    if owner is None:
        return False
    perform(d, d.ownership.start_failed(router.name, router, owner))
    return True


async def held(d: Dispatcher, function: str) -> common_pb2.ControlInstance:
    """Wait while function is handed over; returns its new owner (bounded:
    the handover RPCs have deadlines)."""
    fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
    d.ownership.hold(function, fut)
    try:
        await fut
    except Moved as moved:
        return moved.owner
    raise AssertionError("a held request is only ever forwarded")


def node_dead(d: Dispatcher, node_id: str) -> None:
    """Stop routing to instances on a dead node; replace them for waiters
    (and starts from credits still waiting on it go through Schedule)."""
    d.peers.creates.node_dead(node_id)  # ``Peers.from_credit`` then returns None
    if d.peers.credits is not None:
        # Its credits too: the next start would otherwise create there, on
        # an agent that is gone (a failed round trip) or stopped (a create
        # that waits for the create watch's probe, 5 s, with the node
        # already declared dead).
        d.peers.credits.drop(lambda c: c.node_id != node_id)
    actions = d.ownership.node_dead(d.routers, node_id)
    for a in actions:
        if isinstance(a, own.ScaleUp):
            lost = sum(isinstance(x, own.Unrouted) and x.function == a.function for x in actions)
            log.warning("node %s is dead: dropped %d instances of %s", node_id, lost, a.function)
    perform(d, actions)


def function_deleted(d: Dispatcher, name: str) -> None:
    """Forget a deleted function and its revisions; stop their instances."""
    routed = [n for n in d.routers if n == name or routing_key(n) == name] or [name]
    reason = f"function {name!r} was deleted"
    perform(d, d.ownership.function_deleted(d.routers, routed, reason))


async def function_updated(d: Dispatcher, name: str) -> None:
    """A new version of function name: its spec is read again and applied
    (a new revision of a split function is routed on its own)."""
    try:
        await revisions.holds_lapse(d, name)
    finally:  # at once (and even if the call was cancelled meanwhile)
        d.specs.pop(name, None)
    if await revisions.function_updated(d, name):
        return
    router = d.routers.get(name)
    if router is not None:
        spec = await d.spec(name)
        router.lease_ttl_s = d.request_timeout_s(spec)  # new leases only
        d.wake(router.update_spec(spec.concurrency or 1, spec.max_scale or 1))
    elif d.owner(name) is None:
        # Route it from now on, so min_scale instances start before the
        # first request.
        d.router(await d.spec(name))


async def coordinate(
    d: Dispatcher, request: common_pb2.CoordinateRequest
) -> common_pb2.CoordinateReply:
    """The controller's Coordinate call: a new membership, then its actions."""
    if request.HasField("membership"):
        d.membership_changed(request.membership)
    for action in request.actions:
        if action.kind == common_pb2.CoordinateAction.KIND_FUNCTION_DELETED:
            function_deleted(d, action.function)
        elif action.kind == common_pb2.CoordinateAction.KIND_NODE_DEAD:
            node_dead(d, action.node_id)
        elif action.kind == common_pb2.CoordinateAction.KIND_FUNCTION_UPDATED:
            await function_updated(d, action.function)
    return common_pb2.CoordinateReply(epoch=d.membership.epoch)


async def recover(d: Dispatcher, records: list[common_pb2.InstanceInfo]) -> int:
    """Adopt instances recorded by a previous incarnation, after checking
    with their node agents that they still run; returns how many.

    The store may hold records of instances that died while no Dispatch
    was watching, so the node agents are the authority.
    """
    live, gone = await d.peers.running(records)
    awake = await llmsleep.recovered(d, live)  # (sleeping ones sleep on)
    perform(
        d,
        d.ownership.recover(
            [(i.function, i.instance_id, i) for i in awake],
            [(i.function, i.instance_id) for i in gone],
        ),
    )
    return len(live)


async def mod_instance(
    d: Dispatcher, request: dispatch_pb2.ModInstanceRequest
) -> dispatch_pb2.ModInstanceReply:
    """An instance handed over by a peer (OP_ADD, with its active leases) or
    reported gone (OP_REMOVE)."""
    info = request.instance
    if not info.instance_id or not info.function:
        raise InvalidArgument("instance.instance_id and instance.function: required")
    router = d.routers.get(info.function)
    if request.op == dispatch_pb2.ModInstanceRequest.OP_ADD:
        if not info.address:
            raise InvalidArgument("instance.address: required for OP_ADD")
        if router is None:
            router = d.router(await d.spec(info.function))
        # The leases go in with the instance: counted before any waiter is
        # served on it, so no slot the previous owner leased out is given again.
        leases = d.ownership.unreleased(list(request.active_leases))
        changed = d.add(router, info, cold=False, leases=leases)
        return dispatch_pb2.ModInstanceReply(changed=changed)
    if request.op == dispatch_pb2.ModInstanceRequest.OP_REMOVE:
        if d.sleeping.take(info.function, info.instance_id) is not None:  # exited asleep
            d.unrouted(info.function, info.instance_id)
            return dispatch_pb2.ModInstanceReply(changed=True)
        if router is None:
            return dispatch_pb2.ModInstanceReply(changed=False)
        log.info("instance %s removed: %s", info.instance_id, request.reason or "no reason")
        actions = d.ownership.instance_gone(info.function, router, info.instance_id)
        perform(d, actions)
        return dispatch_pb2.ModInstanceReply(changed=bool(actions))
    raise InvalidArgument("op: must be OP_ADD or OP_REMOVE")


def list_instances(
    d: Dispatcher, request: dispatch_pb2.ListInstancesRequest
) -> dispatch_pb2.ListInstancesReply:
    """What this instance routes: functions, their queues and instances."""
    out = dispatch_pb2.ListInstancesReply(dispatch_id=d.instance_id)
    for name in sorted(d.routers):
        if request.function and request.function not in (name, routing_key(name)):
            continue  # a function's filter takes in its revisions
        r = d.routers[name]
        out.functions.append(
            dispatch_pb2.FunctionRouting(function=name, waiting=len(r.waiters), pending=r.pending)
        )
        failing = d.backoff.state(name)  # start backoff
        if failing is not None:
            row = out.functions[-1]
            row.start_failures, row.start_error = failing.failures, failing.error
            row.backoff_ms = max(0.0, failing.retry_at - d.clock.now()) * 1000.0
        for inst in r.instances.values():
            out.instances.append(
                dispatch_pb2.InstanceState(
                    instance=inst.meta, in_flight=inst.in_flight, draining=inst.draining
                )
            )
        out.instances.extend(llmsleep.listed(d, name))  # not routed, yet wanted
    for name in sorted(set(d.sleeping.policies) - set(d.routers)):  # (after a restart)
        if not request.function or request.function in (name, routing_key(name)):
            out.instances.extend(llmsleep.listed(d, name))
    return out


async def check_routed(d: Dispatcher) -> int:
    """Unroute the instances of d's routers their node agents do not run
    (``routedcheck.ghosts`` decides); returns how many."""
    routed: list[routedcheck.Routed] = []
    where: dict[str, str] = {}
    for name, router in d.routers.items():
        for inst in router.instances.values():
            if inst.meta is not None:
                routed.append(
                    routedcheck.Routed(name, inst.instance_id, inst.node_id, inst.added_at)
                )
                where[inst.node_id] = d.peers.agent_address(inst.meta)
    nodes = list(where)
    found = await asyncio.gather(*(d.peers.node_instances(n, where[n]) for n in nodes))
    gone = routedcheck.ghosts(routed, dict(zip(nodes, found, strict=True)), d.clock.now())
    for g in gone:
        current = d.routers.get(g.function)
        if current is None:
            continue
        log.warning(
            "instance %s of %s is routed but its node agent on %s does not run it: unrouted",
            g.instance_id, g.function, g.node_id,
        )  # fmt: skip
        routedcheck.ROUTED_NOT_RUNNING.inc()
        perform(d, d.ownership.instance_gone(g.function, current, g.instance_id))
    return len(gone)
