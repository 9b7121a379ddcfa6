"""What a Dispatch instance does when an instance arrives: one it started
(a cold start), one a peer handed over, or one recovered after a restart.

Pure (no I/O, no clock): ``decide`` says where the instance goes and
``join`` adds it to a router. The Dispatch servicer's ``Dispatcher.add``
and the simulator's Galaxy model (``simulator/galaxy/handover.py``) both
drive them and perform the rest (the handover call, the delete on the
node, the instance record, waking the served waiters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from functions.dispatch.policy import FunctionRouter, Grant, Instance, Waiter

O = TypeVar("O")  # noqa: E741 - an owner, as the caller names peers


@dataclass(frozen=True)
class Arrival(Generic[O]):
    """Where an arrived instance goes. In order: when ``late``, the start's
    own (dropped) router first serves the waiters it kept for it
    (``Ownership.start_done``, which gives the leases it then carries);
    then it goes to ``owner`` with its leases, or joins ``route``
    (``join``, as a cold start when ``cold``), or, with neither, it is
    stopped on its node."""

    late: bool
    owner: O | None
    route: FunctionRouter | None
    cold: bool

    @property
    def delete(self) -> bool:
        """Nobody routes the function any more: stop the instance."""
        return self.owner is None and self.route is None


def decide(
    started: FunctionRouter | None,
    current: FunctionRouter | None,
    owner: O | None,
    cold: bool,
) -> Arrival[O]:
    """The fate of an instance that arrives for router ``started`` while
    ``current`` routes its function here (None: not routed here) and
    ``owner`` owns it (None: this instance)."""
    if current is started:
        return Arrival(False, None, current, cold)
    # The function moved, or was deleted (and maybe redeployed), while the
    # instance started: it goes to whoever routes it now, after it served
    # the waiters kept here for it (``ownership``).
    late = cold and (owner is not None or current is not None)
    if owner is not None:
        return Arrival(late, owner, None, False)
    # The new router never counted it pending: not a cold start there.
    return Arrival(late, None, current, False)


def join(
    router: FunctionRouter, inst: Instance, cold: bool, leases: list[str] | None
) -> tuple[bool, list[tuple[Waiter, Grant]]]:
    """Add ``inst`` to ``router`` (a cold start ends its pending count;
    an adopted one brings ``leases``, counted before any waiter is served).
    Returns whether it is new there and the waiters it serves. A repeated
    arrival only ends its start and adds leases not yet known."""
    known = router.instances.get(inst.instance_id)
    if known is not None:
        if cold and router.surplus_starts:
            router.surplus_starts -= 1
        elif cold:
            router.pending = max(0, router.pending - 1)
        return False, (router.add_instance(known, leases=leases) if leases else [])
    if cold:
        return True, router.scale_up_done(inst)
    return True, router.add_instance(inst, leases=leases)
