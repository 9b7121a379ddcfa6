"""Which heartbeats ClusterMgr passes on to the Schedule instance that owns
the node, and how long each may wait in the outbox for company: the
decision shared by the servicer and the simulator. Pure: times come from
the caller's clock.

Three kinds of status go on (``Send``):

- **news** (``NOW``: sent at once): what the owner cannot know otherwise --
  capacity freed (an instance stopped or failed), a capacity, address,
  incarnation or model-cache change, a node back from the dead. A node
  agent reports a free at once, and an exact partition
  (``functions.schedule.policy``) relies on hearing of it promptly;
- **covered** (``COVERED``: may wait ``covered_linger_s``, ``COVERED_BEATS``
  heartbeat periods by default): the allocation only grew, or a start became ready --
  work the owner placed itself (a placement it confirmed, or a start from
  a capacity credit it granted, whose hold counts the whole slice). Its
  view counts that already: a confirmed placement stays counted until a
  status at or past its node seq settles it, a credit's hold until the
  use is reported, returned or expired (the holder uses a credit no later
  than ``renew_s`` before its expiry, the hold outlives that by
  ``grace_s``). So the status is bookkeeping, never capacity the owner
  would otherwise give away, and waiting for company cannot over-commit
  a node;
- **refresh** (``REFRESH``: may wait ``refresh_linger_s``): an unchanged
  status, forwarded only when the owner has not heard of the node for
  ``refresh_beats`` heartbeat periods, so a restarted Schedule instance
  relearns its partition soon without Schedule paying for every beat
  (forwarding every beat cost Schedule ~0.1 core at idle with 210 nodes,
  bench profile).

The bound: a covered status reaches the owner at most ``covered_linger_s``
after ClusterMgr has it (plus the call), or with the first message of any
kind that goes to the same Schedule instance before that. The one case a
covered status does tell the owner something new is an allocation it did
not make -- a partition handover's straggling starts, a credit used after
its hold was dropped: then the owner's view is optimistic for at most that
long, and a placement it sends there meanwhile is refused by the node
agent (which checks its own capacity), which puts the node in doubt until
probed (``PlacementPolicy.reject``) -- as before, only a little later.
"""

from __future__ import annotations

import enum

from functions.clustermgr.policy import Updated
from galaxy.v1 import common_pb2

#: An unchanged heartbeat is forwarded once per this many beats.
REFRESH_BEATS = 10
#: A covered status waits at most this many heartbeat periods for company.
#: At a low start rate its company is mostly the free of the instance whose
#: start it reports (an instance serves a request, idles a tick and stops:
#: 1-3 s later on the low-rate trace): within one period half the covered
#: statuses found company, within two nine in ten (docs/simulator-costs.md,
#: "Idle cost").
COVERED_BEATS = 2

_FIELDS = ("cpu_millis", "memory_mib", "gpus")


class Send(enum.Enum):
    """What a forwarded status is to its owner (see the module docstring)."""

    NOW = "now"
    COVERED = "covered"
    REFRESH = "refresh"


def classify(
    outcome: Updated, old: common_pb2.NodeStatus | None, new: common_pb2.NodeStatus
) -> Send:
    """The kind of a recorded heartbeat: ``old`` is the node's status before
    it (None: none known), ``new`` the heartbeat's, ``outcome`` what the
    registry made of it (UNKNOWN and STALE statuses are never forwarded)."""
    if outcome is Updated.SAME:
        return Send.REFRESH
    if outcome is Updated.CHANGED and old is not None and covered(old, new):
        return Send.COVERED
    return Send.NOW


def covered(old: common_pb2.NodeStatus, new: common_pb2.NodeStatus) -> bool:
    """Whether ``new`` differs from ``old`` only by work the node's owner
    placed: the allocation grew (a start) or its settled part grew (a
    start became ready), nothing shrank, and the node is the same one
    (capacity, address, incarnation, models)."""
    if (
        new.address != old.address
        or new.incarnation != old.incarnation
        or new.capacity != old.capacity
        or new.models != old.models
    ):
        return False
    a0, a1, s0, s1 = old.allocated, new.allocated, old.starting, new.starting
    for f in _FIELDS:
        was, now = getattr(a0, f), getattr(a1, f)
        if now < was:
            return False  # freed
        # The settled part (allocated - starting) is what a status alone
        # tells the owner: if it shrank, something stopped while another
        # started in the same beat -- a free the growth hides.
        if now - getattr(s1, f) < was - getattr(s0, f):
            return False
    return True


class HeartbeatForwarding:
    """Remembers when each node's status last went to its Schedule owner,
    and decides which heartbeats go on and how long each may wait.

    refresh_linger_s / covered_linger_s: how long a refresh / a covered
    status may wait in the outbox for company (default: one heartbeat
    period / ``COVERED_BEATS`` periods)."""

    def __init__(
        self,
        heartbeat_s: float,
        refresh_beats: int = REFRESH_BEATS,
        *,
        refresh_linger_s: float | None = None,
        covered_linger_s: float | None = None,
    ) -> None:
        if heartbeat_s <= 0 or refresh_beats < 1:
            raise ValueError("heartbeat_s must be > 0 and refresh_beats >= 1")
        self.refresh_s = refresh_beats * heartbeat_s
        self.waits = {
            Send.NOW: 0.0,
            Send.COVERED: (
                COVERED_BEATS * heartbeat_s if covered_linger_s is None else covered_linger_s
            ),
            Send.REFRESH: heartbeat_s if refresh_linger_s is None else refresh_linger_s,
        }
        if min(self.waits.values()) < 0:
            raise ValueError("lingers must be >= 0")
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

    def wait_s(
        self,
        outcome: Updated,
        old: common_pb2.NodeStatus | None,
        new: common_pb2.NodeStatus,
        now: float,
    ) -> float | None:
        """How long the status of this heartbeat may wait for company in the
        outbox, or None: it does not go on (``should_forward``)."""
        if not self.should_forward(new.node_id, outcome, now):
            return None
        return self.waits[classify(outcome, old, new)]

    def sent(self, node_id: str, now: float) -> None:
        """The status went to the owner by another path (registration, an
        owner change)."""
        self._last[node_id] = now

    def forget(self, node_id: str) -> None:
        """The node is gone or moved away from this ClusterMgr."""
        self._last.pop(node_id, None)
