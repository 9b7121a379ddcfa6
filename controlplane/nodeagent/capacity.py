"""Resource amounts and a node's capacity bookkeeping.

Pure policy: no I/O, no clock. ``NodeCapacity`` is one node's ledger of
which instance holds what; ``Res`` (re-exported here) lives in
``controlplane.runtime.resources``.
"""

from __future__ import annotations

from collections.abc import Iterator

from controlplane.runtime.errors import ResourceExhausted
from controlplane.runtime.resources import Res
from galaxy.v1 import common_pb2

ZERO = Res()


class NodeCapacity:
    """One node's capacity and the resources each instance holds.

    Idempotent by instance id: allocating an id that already holds resources
    changes nothing, freeing an unknown id changes nothing. This is what makes
    CreateInstance/DeleteInstance retries safe.
    """

    def __init__(self, capacity: Res | common_pb2.Resources, node_id: str = "") -> None:
        if not isinstance(capacity, Res):
            capacity = Res.from_proto(capacity)
        if capacity != capacity.clamped():
            raise ValueError(f"capacity must not be negative: {capacity}")
        self.node_id = node_id
        self.capacity = capacity
        self._held: dict[str, Res] = {}
        # Kept as a running sum so free_resources() is O(1) on the probe path.
        self._allocated = ZERO

    @property
    def allocated(self) -> Res:
        """Sum of everything held."""
        return self._allocated

    def free_resources(self) -> Res:
        """Capacity minus allocation."""
        return self.capacity - self._allocated

    def fits(self, req: Res) -> bool:
        """True when req fits the free resources now."""
        # req.fits_in(self.free_resources()) without making the Res.
        c, a = self.capacity, self._allocated
        return (
            req.cpu_millis <= c.cpu_millis - a.cpu_millis
            and req.memory_mib <= c.memory_mib - a.memory_mib
            and req.gpus <= c.gpus - a.gpus
        )

    def holds(self, instance_id: str) -> bool:
        """True when instance_id holds an allocation."""
        return instance_id in self._held

    def held(self, instance_id: str) -> Res | None:
        """What instance_id holds, or None."""
        return self._held.get(instance_id)

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def allocate(self, instance_id: str, req: Res) -> bool:
        """Reserve req for instance_id.

        Returns True when newly allocated, False when instance_id already
        held an allocation (kept as it was). Raises ResourceExhausted with the
        components that fall short when req does not fit.
        """
        if instance_id in self._held:
            return False
        clamped = req.clamped()  # req itself when nothing is negative
        if clamped is not req and req != clamped:
            raise ValueError(f"a resource request must not be negative: {req}")
        if not self.fits(req):
            free = self.free_resources()
            node = f"node {self.node_id}" if self.node_id else "node"
            raise ResourceExhausted(f"{node} has " + "; ".join(free.shortfall(req)))
        self._held[instance_id] = req
        self._allocated = self._allocated + req
        return True

    def free(self, instance_id: str) -> Res | None:
        """Release what instance_id holds; returns it, or None if nothing was held."""
        req = self._held.pop(instance_id, None)
        if req is not None:
            self._allocated = self._allocated - req
        return req
