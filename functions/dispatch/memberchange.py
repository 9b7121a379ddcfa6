"""What one Dispatch instance does when the membership changes, and in
which order. Pure (no I/O, no clock): the Dispatch servicer's
``Dispatcher.membership_changed`` and the simulator's Galaxy model
(``simulator/galaxy/handover.py`` ``Handovers.repartition``) both call
``membership_changed`` and perform what it returns, in this order:

1. credits whose grantor no longer owns their node are dropped (the new
   owner knows nothing of them); when any were, a refill is asked at once
   (``refill``: a busy holder would otherwise start through Schedule until
   its next periodic exchange);
2. the functions whose owner is now another instance are handed over
   (``Ownership.membership_changed``: routes dropped, instances sent with
   their leases, waiters held or kept for the starts under way), the
   ``actions`` performed in the order given.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from functions.dispatch.credits import Credit, CreditWallet
from functions.dispatch.ownership import Action, Ownership
from functions.dispatch.policy import FunctionRouter

K = TypeVar("K", bound=Hashable)
O = TypeVar("O")  # noqa: E741 - an owner, as the caller names peers


@dataclass(frozen=True)
class MembershipWork(Generic[K]):
    """A membership change's work for one Dispatch instance (see module)."""

    #: credits were dropped: ask the grantors for a refill now
    refill: bool
    #: the handovers' actions, to perform in order
    actions: list[Action]


def membership_changed(
    ownership: Ownership[K, O],
    routers: Mapping[K, FunctionRouter],
    owner_of: Callable[[K], O | None],
    wallet: CreditWallet | None,
    grantor_owns: Callable[[Credit], bool],
) -> MembershipWork[K]:
    """The work of a membership change, in order (see module docstring).
    ``owner_of`` gives a function's owner (None: this instance);
    ``grantor_owns`` tells whether a credit's grantor still owns its node."""
    dropped = wallet.drop(grantor_owns) if wallet is not None else 0
    return MembershipWork(dropped > 0, ownership.membership_changed(routers, owner_of))
