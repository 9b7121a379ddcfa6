"""Membership of control function instances: a pure object (no I/O).

The controller is the one place that decides membership, so every instance
computes the same rendezvous partitions from the same epoch.

A member is READY (takes traffic), WARMING (registered, filling its cache;
only the instances that feed it see it), DRAINING (leaving; nobody routes
to it any more, it finishes what it has) or STANDBY (a warm standby: started
and registered, seen by nobody, until a scale-out promotes it). Which instances see a warming one
is ``WARM_AUDIENCE``: a new Schedule instance is known to ClusterMgr (which
sends it the nodes of its partition) and to the other Schedule instances
(which give those nodes up), but not yet to Dispatch, which would send it
placements before it knows any node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controlplane.runtime.clock import Clock, MonotonicClock
from galaxy.v1 import common_pb2

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR

#: Kinds whose new instances warm up before they take traffic, and the kinds
#: that see them while they do (besides the warming instance itself).
WARM_AUDIENCE: dict[int, frozenset[int]] = {SCHEDULE: frozenset({SCHEDULE, CLUSTERMGR})}


class State(enum.Enum):
    """Lifecycle of a member."""

    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    STANDBY = "standby"


@dataclass
class Member:
    """A registered control function instance and its latest load report."""

    info: common_pb2.ControlInstance
    registered_at: float
    last_report_at: float | None = None
    ops_per_second: dict[str, float] = field(default_factory=dict)
    queue_depth: int = 0
    errors: int = 0
    state: State = State.READY
    #: Restored from the state store by a newly elected controller and not
    #: heard from since: it expires unless it reports.
    seeded: bool = False
    #: When it last became READY (its load reports count from then on).
    ready_since: float = 0.0


class ControlRegistry:
    """Registered instances by (kind, id); every change bumps the epoch.

    warm_kinds: kinds whose new members start WARMING (the controller passes
    the keys of ``WARM_AUDIENCE``); by default every member is READY at once.
    on_change: called after every change and every load report (the
    controller wakes its waiters from it).
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        warm_kinds: Iterable[int] = (),
        on_change: Callable[[], None] | None = None,
        epoch_base: int = 0,
    ) -> None:
        self.clock = clock or MonotonicClock()
        #: Epochs start above epoch_base: a restarted controller passes one
        #: above anything its previous incarnation sent (``wall_epoch_base``),
        #: since components ignore a membership older than the one they hold.
        self.epoch = epoch_base
        self.warm_kinds = frozenset(warm_kinds)
        self.on_change = on_change
        self._members: dict[tuple[int, str], Member] = {}

    def _changed(self, bump: bool = True) -> None:
        if bump:
            self.epoch += 1
        if self.on_change is not None:
            self.on_change()

    def register(self, info: common_pb2.ControlInstance) -> bool:
        """Add or update an instance; True when membership changed.

        Re-registering with the same address is a no-op (idempotent retries);
        a new address for the same id (a restarted instance) is a change.
        """
        key = (info.kind, info.id)
        cur = self._members.get(key)
        if cur is not None and cur.info.address == info.address:
            cur.seeded = False
            return False
        now = self.clock.now()
        self._members[key] = Member(
            common_pb2.ControlInstance(
                id=info.id,
                kind=info.kind,
                address=info.address,
                metrics_address=info.metrics_address,
            ),
            now,
            state=State.STANDBY if info.standby else self._joining(info.kind),
            ready_since=now,
        )
        # A standby changes nobody's membership: no new epoch for it.
        self._changed(bump=not info.standby)
        return True

    def _joining(self, kind: int) -> State:
        return State.WARMING if kind in self.warm_kinds else State.READY

    def promote(self, kind: int, n: int) -> list[Member]:
        """Turn up to n standbys of kind into members that join (WARMING or
        READY, as a new registration would), oldest standby first; returns
        them. One new epoch for all of them."""
        now = self.clock.now()
        standbys = self.members(kind, State.STANDBY)
        picked = sorted(standbys, key=lambda m: m.registered_at)[: max(0, n)]
        for m in picked:
            m.state = self._joining(kind)
            m.ready_since = now
        if picked:
            self._changed()
        return picked

    def deregister(self, kind: int, instance_id: str) -> bool:
        """Remove an instance; True when it was a member."""
        if self._members.pop((kind, instance_id), None) is None:
            return False
        self._changed()
        return True

    def get(self, kind: int, instance_id: str) -> Member | None:
        """The member, if registered."""
        return self._members.get((kind, instance_id))

    def set_state(self, kind: int, instance_id: str, state: State) -> bool:
        """Move a member to state (WARMING -> READY, or to DRAINING); True
        when it changed."""
        m = self._members.get((kind, instance_id))
        if m is None or m.state is state:
            return False
        m.state = state
        if state is State.READY:
            m.ready_since = self.clock.now()
        self._changed()
        return True

    def report(
        self, kind: int, instance_id: str, ops: dict[str, float], queue_depth: int, errors: int
    ) -> bool:
        """Record a load report; False when the reporter is not a member."""
        m = self._members.get((kind, instance_id))
        if m is None:
            return False
        m.last_report_at = self.clock.now()
        m.ops_per_second = dict(ops)
        m.queue_depth = queue_depth
        m.errors = errors
        m.seeded = False
        self._changed(bump=False)
        return True

    def silent(self, silent_s: float, unconfirmed_s: float | None = None) -> list[Member]:
        """Members silent for longer than silent_s (see ``expire``); a seeded
        member that has not reported since, for longer than unconfirmed_s
        when given."""
        now = self.clock.now()
        out = []
        for m in self._members.values():
            last = m.last_report_at if m.last_report_at is not None else m.registered_at
            bound = silent_s
            if m.seeded and m.last_report_at is None and unconfirmed_s is not None:
                bound = unconfirmed_s
            if (m.last_report_at is not None or m.seeded) and now - last > bound:
                out.append(m)
        return out

    def expire(self, silent_s: float) -> list[Member]:
        """Remove members silent for longer than silent_s and return them.

        Only members that have reported before (or were restored from the
        store) can expire: a member that never reports (a test stand-in, or
        an instance with reporting off) stays until it deregisters.
        """
        gone = self.silent(silent_s)
        for m in gone:
            del self._members[(m.info.kind, m.info.id)]
        if gone:
            self._changed()
        return gone

    def seed(self, infos: Iterable[common_pb2.ControlInstance], epoch_base: int) -> None:
        """Adopt the membership a previous controller left in the store.

        The epoch starts above epoch_base, so instances accept what this
        controller sends over what the previous one sent.
        """
        now = self.clock.now()
        for info in infos:
            key = (info.kind, info.id)
            if key not in self._members:
                self._members[key] = Member(info, now, seeded=True, ready_since=now)
        self.epoch = max(self.epoch, epoch_base)
        self._changed()

    def members(self, kind: int | None = None, *states: State) -> list[Member]:
        """Members (of one kind, in the given states, if given), sorted by kind then id."""
        return [
            m
            for k, m in sorted(self._members.items())
            if (kind is None or k[0] == kind) and (not states or m.state in states)
        ]

    def visible(self, m: Member, viewer_kind: int | None) -> bool:
        """Whether an instance of viewer_kind (None: a node agent or client)
        sees member m in its membership."""
        if m.state is State.READY:
            return True
        if m.state is State.WARMING:
            return viewer_kind is not None and viewer_kind in WARM_AUDIENCE.get(m.info.kind, ())
        return False

    def membership(self, viewer_kind: int | None = None) -> common_pb2.Membership:
        """The membership as an instance of viewer_kind sees it (default:
        only READY members, as node agents and clients see it)."""
        return common_pb2.Membership(
            epoch=self.epoch,
            instances=[m.info for m in self.members() if self.visible(m, viewer_kind)],
        )


def wall_epoch_base(now_s: float) -> int:
    """An epoch base from the wall clock: seconds << 20. A controller that
    restarts a second or more later starts above every epoch its previous
    incarnation reached (unless that one made over a million membership
    changes per second of its life), with no state to keep."""
    return int(now_s) << 20
