"""What a ``FunctionRouter`` (``functions.dispatch.policy``) hands out and
keeps per request: the instances whose slots it leases, a grant of one
slot, a queued request, and the refusal of a full queue. Plain records, no
behaviour beyond a slot count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass
class Instance:
    """A routable function instance and its slots in use. ``in_flight``,
    ``draining`` and ``concurrency`` belong to the router that routes to it:
    it indexes instances by them, so change them only through its methods."""

    instance_id: str
    address: str
    node_id: str
    concurrency: int
    in_flight: int = 0
    draining: bool = False
    added_at: float = 0.0
    #: when a slot of it last came back (the router's clock): a load scraped
    #: before then still counts a request that has ended
    released_at: float = 0.0
    #: opaque to the policy: what the caller needs later (e.g. the proto).
    meta: Any = None

    @property
    def free(self) -> int:
        """Slots free for new requests (none while draining)."""
        # (a conditional expression, not max(0, ...): a tenth of the cost)
        free = self.concurrency - self.in_flight
        return 0 if self.draining or free < 0 else free


class Grant(NamedTuple):
    """A reserved slot: send the request to instance, then release lease_id.
    (A named tuple: one is made per request, several times faster than a
    frozen dataclass.)"""

    lease_id: str
    instance: Instance
    cold_start: bool


@dataclass(eq=False)
class Waiter:
    """A queued request. ``token`` is the caller's (e.g. a future)."""

    seq: int
    enqueued_at: float
    token: Any = None
    done: bool = False


class QueueFull(Exception):
    """The function's wait queue is at its limit."""
