"""Dispatch's protocol core: what one Dispatch instance does when the
functions it routes change hands, when a node dies, when a function is
deleted, when a peer hands it an instance, and when it restarts.

No I/O and no clock of its own (the routers carry the injected clock):
``Ownership`` takes events and returns actions, dataclasses the caller
performs in the order given. The gRPC servicer performs them with RPCs and
store writes (``coordination.py``); the simulator's Galaxy model performs
them as events with network and service delays. Functions are keys of any
hashable type (names in production, indexes in the simulator) and owners are
whatever the caller uses for a peer (a ``ControlInstance``, a simulated
process).

A handover, in order (the order is the protocol):

1. ``membership_changed``: the routing state is taken and dropped at once
   (``DropRoute``; each instance leaves the routing table, ``Unrouted``)
   and the instances go to the new owner with the slots still reserved on
   them (``SendInstances``). Waiting requests are held.
2. ``instances_sent``, once the new owner has them: only now are the held
   waiters (and arrivals held meanwhile) forwarded (``ForwardWaiters``).
   Forwarding first would make the new owner cold-start an instance it is
   about to receive.

Starts under way stay with the previous owner, and so do the waiters they
cover (the oldest, up to ``pending * concurrency``): forwarded, the new
owner's router (which counts no start under way) would start instances for
them a second time, and the first ones would arrive with no one left to
serve (the surplus starts of docs/simulator.md's saturation flood). Each
such start, once ready (``start_done``), serves the kept waiters here and
then goes to the current owner with the leases it now carries; one that
fails (``start_failed``) forwards the waiters no start covers any more.

A ``Release`` that reaches the new owner before the lease it releases
(``release`` of an unknown lease) is remembered, so ``adopt`` does not
count that lease when the instance arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from controlplane.runtime import validation
from functions.dispatch.policy import FunctionRouter, Grant, Instance, Waiter

K = TypeVar("K", bound=Hashable)
O = TypeVar("O")  # noqa: E741 - an owner, as the caller names peers
#: Releases of unknown leases remembered for a late handover.
RELEASED_UNKNOWN_MAX = 10_000


@dataclass(frozen=True)
class DropRoute(Generic[K]):
    """Stop routing ``function`` here: drop its router (and its spec when
    ``deleted``)."""

    function: K
    deleted: bool = False


@dataclass(frozen=True)
class Unrouted(Generic[K]):
    """``instance`` left this instance's routing table: delete its record."""

    function: K
    instance: Instance


@dataclass(frozen=True)
class SendInstances(Generic[K, O]):
    """Give ``owner`` these instances, each with the leases reserved on it;
    report ``instances_sent(handover)`` once all are delivered (or failed)."""

    owner: O
    function: K
    instances: list[tuple[Instance, list[str]]]
    #: this handover's number (a function may move again before it ends)
    handover: int = 0


@dataclass(frozen=True)
class ForwardWaiters(Generic[K, O]):
    """Send these held requests (and any held arrivals) to ``owner``."""

    owner: O
    function: K
    waiters: list[Waiter]
    #: the handover that held them (``SendInstances.handover``)
    handover: int = 0


@dataclass(frozen=True)
class FailWaiters(Generic[K]):
    """Answer these requests with an error saying ``reason``."""

    function: K
    waiters: list[Waiter]
    reason: str


@dataclass(frozen=True)
class DeleteOnNode(Generic[K]):
    """Have the instance's node agent stop it."""

    function: K
    instance: Instance


@dataclass(frozen=True)
class ScaleUp(Generic[K]):
    """Start what ``function``'s waiters now need (``scale_ups_needed``)."""

    function: K


@dataclass(frozen=True)
class Serve(Generic[K]):
    """Give these waiters their grants (slots on an instance just started)."""

    function: K
    grants: list[tuple[Waiter, Grant]]


@dataclass(frozen=True)
class Record:
    """Write an instance record (``None``: delete it)."""

    function: Any
    instance_id: str
    value: Any


Action = (
    DropRoute[Any]
    | Unrouted[Any]
    | SendInstances[Any, Any]
    | ForwardWaiters[Any, Any]
    | FailWaiters[Any]
    | DeleteOnNode[Any]
    | ScaleUp[Any]
    | Serve[Any]
    | Record
)


def handover(router: FunctionRouter) -> list[tuple[Instance, list[str]]]:
    """Everything a new owner needs of ``router``: each instance with its
    active leases (it adds them with ``FunctionRouter.add_instance``)."""
    by_inst: dict[str, list[str]] = {i: [] for i in router.instances}
    for lid, (iid, _) in router.leases.items():
        by_inst.setdefault(iid, []).append(lid)
    return [(inst, by_inst[iid]) for iid, inst in router.instances.items()]


@dataclass
class Ownership(Generic[K, O]):
    """The handover, recovery and late-release state of one Dispatch instance."""

    released_max: int = RELEASED_UNKNOWN_MAX
    #: functions being handed over -> the newest handover's number
    moving: dict[K, int] = field(default_factory=dict)
    #: handovers under way: number -> (function, new owner, requests held)
    handovers: dict[int, tuple[K, O, list[Waiter]]] = field(default_factory=dict)
    #: instances recovered at start-up, by function, adopted when the
    #: function's router is made (its spec is needed first)
    recovered: dict[K, list[Any]] = field(default_factory=dict)
    _released_unknown: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _serial: int = 0

    # -- membership ------------------------------------------------------------

    def membership_changed(
        self, routers: Mapping[K, FunctionRouter], owner_of: Callable[[K], O | None]
    ) -> list[Action]:
        """Hand over every routed function whose owner is now another instance
        (``owner_of`` gives None for this one). The routers in ``routers``
        are not changed here: ``DropRoute`` says which ones to drop."""
        out: list[Action] = []
        for key, router in list(routers.items()):
            owner = owner_of(key)
            if owner is None:
                continue
            moved = handover(router)
            held = router.fail_all()
            # The oldest waiters wait here for the starts under way (see the
            # module docstring); the router keeps only those and the starts.
            kept = min(len(held), router.pending * router.concurrency)
            for w in held[:kept]:
                w.done = False  # (``fail_all`` marked it finished)
                router.waiters.append(w)
            held = held[kept:]
            out.append(DropRoute(key))
            for inst, _ in moved:
                if router.remove_instance(inst.instance_id) is not None:
                    out.append(Unrouted(key, inst))
            self._serial += 1
            self.moving[key] = self._serial
            self.handovers[self._serial] = (key, owner, held)
            out.append(SendInstances(owner, key, moved, self._serial))
        return out

    def handing_over(self, function: K) -> bool:
        """True while ``function``'s instances are on their way to its new
        owner: hold requests for it until ``instances_sent``."""
        return function in self.moving

    def hold(self, function: K, token: Any) -> Waiter:
        """Hold an arrival (``token`` is the caller's) until the function's
        handover ends; it is forwarded with the requests held at the start."""
        waiter = Waiter(-1, 0.0, token)
        self.handovers[self.moving[function]][2].append(waiter)
        return waiter

    def instances_sent(self, handover: int) -> list[Action]:
        """The new owner has the instances of ``handover`` (or the sends gave
        up): forward the requests it held."""
        got = self.handovers.pop(handover, None)
        if got is None:
            return []
        key, owner, held = got
        if self.moving.get(key) == handover:
            del self.moving[key]
        return [ForwardWaiters(owner, key, held, handover)]

    def start_done(
        self, key: K, router: FunctionRouter, inst: Instance
    ) -> tuple[list[Action], list[str]]:
        """A start ``router`` asked for is ready after ``router`` was handed
        over: it serves the waiters kept for it (``Serve``), then leaves
        ``router``. Returns the actions and the leases now on the instance:
        the caller gives both to whoever routes the function now."""
        grants = router.scale_up_done(inst)
        leases = [lid for lid, (iid, _) in router.leases.items() if iid == inst.instance_id]
        router.remove_instance(inst.instance_id)
        return ([Serve(key, grants)] if grants else []), leases

    def start_failed(self, key: K, router: FunctionRouter, owner: O) -> list[Action]:
        """A start ``router`` asked for failed after ``router`` was handed over
        to ``owner``: the waiters no start under way covers now go there."""
        out = router.scale_up_failed()  # all of them when nothing is starting
        covered = router.pending * router.concurrency
        while len(router.waiters) > covered:
            w = router.waiters.pop()
            w.done = True
            out.append(w)
        out.sort(key=lambda w: w.seq)
        return [ForwardWaiters(owner, key, out)] if out else []

    # -- instances ---------------------------------------------------------------

    def node_dead(self, routers: Mapping[K, FunctionRouter], node_id: str) -> list[Action]:
        """Stop routing to the dead node's instances; replace them for waiters."""
        out: list[Action] = []
        for key, router in routers.items():
            lost = [i for i in router.instances.values() if i.node_id == node_id]
            for inst in lost:
                router.remove_instance(inst.instance_id)
                out.append(Unrouted(key, inst))
            if lost:
                out.append(ScaleUp(key))
        return out

    def instance_gone(self, key: K, router: FunctionRouter, instance_id: str) -> list[Action]:
        """An instance exited (its node agent said so): unroute it; waiters
        that counted on it may need a new one."""
        inst = router.remove_instance(instance_id)
        if inst is None:
            return []
        return [Unrouted(key, inst), ScaleUp(key)]

    def function_deleted(
        self, routers: Mapping[K, FunctionRouter], keys: list[K], reason: str
    ) -> list[Action]:
        """Forget deleted functions (a function and its revisions): their
        waiters fail, their instances are unrouted and stopped."""
        out: list[Action] = []
        for key in keys:
            out.append(DropRoute(key, deleted=True))
            router = routers.get(key)
            if router is None:
                continue
            out.append(FailWaiters(key, router.fail_all(), reason))
            for inst in list(router.instances.values()):
                router.remove_instance(inst.instance_id)
                out.append(Unrouted(key, inst))
                out.append(DeleteOnNode(key, inst))
        return out

    def unreleased(self, leases: list[str]) -> list[str]:
        """The leases of a handed-over instance still held: those not
        released here before they arrived. The instance joins its router
        with them (``FunctionRouter.add_instance(inst, leases=...)``),
        counted before any waiter is served on it."""
        unknown = self._released_unknown
        return [x for x in leases if x not in unknown]

    def release(
        self, router: FunctionRouter | None, lease_id: str
    ) -> tuple[bool, list[tuple[Waiter, Grant]]]:
        """Return a slot; an unknown lease is remembered (bounded), since a
        handover may deliver it after its release."""
        known, grants = (False, []) if router is None else router.release(lease_id)
        if not known:
            self._released_unknown[lease_id] = None
            while len(self._released_unknown) > self.released_max:
                self._released_unknown.popitem(last=False)
        return known, grants

    # -- restart -------------------------------------------------------------------

    def recover(self, live: list[tuple[K, str, Any]], gone: list[tuple[K, str]]) -> list[Action]:
        """Records of a previous incarnation, checked with their node agents:
        ``live`` (function, instance id, record) are adopted when their
        function's router is made and re-recorded under this process's lease
        (the old lease expires with its writer); ``gone`` ones are deleted."""
        out: list[Action] = []
        for key, iid, info in live:
            self.recovered.setdefault(key, []).append(info)
            out.append(Record(key, iid, info))
        out += [Record(key, iid, None) for key, iid in gone]
        return out

    def take_recovered(self, function: K) -> list[Any]:
        """The recovered instances of a function whose router was just made."""
        return self.recovered.pop(function, [])


def lease_revision(lease_id: str) -> str | None:
    """The revision a lease id's slot is filed under, or None when the id is
    not one a Dispatch instance issues (``{instance}:{revision}/{seq}.{nonce}``,
    see FunctionRouter.acquire)."""
    _, colon, rest = lease_id.partition(":")
    name, slash, _ = rest.rpartition("/")
    if not colon or not slash or not validation.NAME_RE.match(name):
        return None
    return name
