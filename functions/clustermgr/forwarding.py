"""Which heartbeats ClusterMgr passes on to the Schedule instance that owns
the node: the decision shared by the servicer and the simulator.

A heartbeat that changed the node's status (capacity, allocation, address,
instances) is forwarded at once; an unchanged one only when the owner has
not heard of the node for ``refresh_beats`` heartbeat periods, so a
restarted Schedule instance relearns its partition soon without Schedule
paying for every beat (forwarding every beat cost Schedule ~0.1 core at idle
with 210 nodes, bench profile). Pure: times come from the caller's clock.
"""

from __future__ import annotations

from functions.clustermgr.policy import Updated

#: An unchanged heartbeat is forwarded once per this many beats.
REFRESH_BEATS = 10


class HeartbeatForwarding:
    """Remembers when each node's status last went to its Schedule owner."""

    def __init__(self, heartbeat_s: float, refresh_beats: int = REFRESH_BEATS) -> None:
        if heartbeat_s <= 0 or refresh_beats < 1:
            raise ValueError("heartbeat_s must be > 0 and refresh_beats >= 1")
        self.refresh_s = refresh_beats * heartbeat_s
        self._last: dict[str, float] = {}

    def should_forward(self, node_id: str, outcome: Updated, now: float) -> bool:
        """Whether this heartbeat's status goes to the owner now (and if so,
        it counts as sent at ``now``)."""
        if outcome in (Updated.UNKNOWN, Updated.STALE):
            return False
        last = self._last.get(node_id)
        if outcome is Updated.SAME and last is not None and now - last < self.refresh_s:
            return False
        self._last[node_id] = now
        return True

    def sent(self, node_id: str, now: float) -> None:
        """The status went to the owner by another path (registration, an
        owner change)."""
        self._last[node_id] = now

    def forget(self, node_id: str) -> None:
        """The node is gone or moved away from this ClusterMgr."""
        self._last.pop(node_id, None)
