"""Dispatch handovers in the Galaxy model, performed as events.

When the membership changes, each function whose Dispatch owner changed is
handed over by its previous owner's production protocol core
(``functions.dispatch.ownership.Ownership``), and this module performs the
actions it returns, as the servicer does with RPCs:

- ``DropRoute``: the function's router leaves the routing table (and its
  autoscaler goes with it: the new owner starts a new one).
- ``SendInstances``: one ModInstance message per instance, with the leases
  reserved on it: a hop to the new owner, its service time there, and the
  reply's hop back. On arrival the new owner's router adds the instance
  with the leases (except those already released there: a release that
  overtook its lease) counted before it serves its waiters; with no room
  under max_scale it takes the place of a start under way there, or else
  serves only its leases (``FunctionRouter.add_instance``).
- once every reply is in, ``instances_sent`` gives ``ForwardWaiters``: each
  request held by the old owner goes one hop to the new owner and is
  dispatched there.

Starts under way stay with the old owner with the waiters they cover
(``Ownership.membership_changed``). One that becomes ready after the
handover serves those waiters there (``Ownership.start_done``: ``Serve``)
and is then sent on the same way with the leases it now carries
(``arrivals.decide``, as ``Dispatcher.add``); one that fails forwards the
waiters no start covers any more (``Ownership.start_failed``).
ModInstance has no calibrated cost of its own: it is charged as a Release
(one map update on the receiving Dispatch instance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from functions.dispatch import arrivals, memberchange
from functions.dispatch import ownership as own
from functions.dispatch.policy import FunctionRouter, Instance
from simulator.system import Req

if TYPE_CHECKING:
    from simulator.galaxy.control import ControlPlane, DispatchInst
    from simulator.galaxy.model import GalaxyModel


class Handovers:
    """Performs the ``Ownership`` actions of the model's Dispatch instances."""

    def __init__(self, model: GalaxyModel) -> None:
        self.m = model
        env = model.env
        self.sim, self.net, self.rec = env.sim, env.net, env.rec
        self.s_mod = env.op("dispatch.release")
        self.s_dispatch = env.op("dispatch.dispatch")
        #: (old owner's id, handover number) -> replies still outstanding
        self._left: dict[tuple[str, int], int] = {}

    def membership_changed(self, cp: ControlPlane, old_owners: dict[int, DispatchInst]) -> None:
        """The membership changed: each Dispatch instance does its work in
        ``memberchange``'s order, as ``Dispatcher.membership_changed``:
        credits whose grantor no longer owns their node are dropped (a
        refill asked at once), then every routed function's previous owner
        (``old_owners``) hands over what it no longer owns. ``cp`` is the
        model's control plane (also while the model is built). (All instances
        drop their credits before any hands over: each step's events are
        independent of the other instances'.)"""
        by_old: dict[str, tuple[DispatchInst, dict[int, FunctionRouter]]] = {}
        routers = self.m.front.routers
        for fn, df in old_owners.items():
            r = routers[fn]
            if r is not None:
                by_old.setdefault(df.id, (df, {}))[1][fn] = r
        owner = cp.dispatch_owner

        def work(df: DispatchInst, live: bool) -> memberchange.MembershipWork[int]:
            def owner_of(fn: int) -> DispatchInst | None:
                new = owner(fn)
                return None if new is df else new

            routed = by_old[df.id][1] if df.id in by_old else {}
            wallet = df.wallet if live else None  # one that left gets no membership
            return memberchange.membership_changed(
                df.ownership, routed, owner_of, wallet, cp.grantor_owns
            )

        works = {df.id: work(df, True) for df in cp.dfs.values()}
        for df, _ in by_old.values():
            if df.id not in works:
                works[df.id] = work(df, False)
        placer = getattr(self.m, "placer", None)  # (not yet while the model is built)
        path = placer.credits if placer is not None else None
        for df in cp.dfs.values():
            if works[df.id].refill and path is not None:  # a busy holder refills at once
                path.sync(df, "", self.sim.now, upkeep=False)
        for df, _ in by_old.values():
            self.perform(df, works[df.id].actions)

    def perform(self, df: DispatchInst, actions: list[own.Action]) -> None:
        """Carry out ``df``'s core's actions as events, in order."""
        for a in actions:
            if isinstance(a, own.DropRoute):
                self.m.front.routers[a.function] = None
                self.m.scaling.forget(a.function)
                self.rec.count("handovers")
            elif isinstance(a, own.SendInstances):
                self._send(df, a)
            elif isinstance(a, own.Serve):
                self.m.front.serve_all(a.grants)
            elif isinstance(a, own.ForwardWaiters):
                t = self.sim.now + self.net.hop()
                for w in a.waiters:
                    self.sim.stage(t, a.owner.station, self.s_dispatch(), self._forwarded, w.token)
            # Unrouted: the simulator keeps no instance records.

    def _send(self, df: DispatchInst, a: own.SendInstances[int, DispatchInst]) -> None:
        if not a.instances:
            self.perform(df, df.ownership.instances_sent(a.handover))
            return
        self._left[(df.id, a.handover)] = len(a.instances)
        t = self.sim.now + self.net.hop()
        for inst, leases in a.instances:
            arg = (df, a, inst, leases)
            self.sim.stage(t, a.owner.station, self.s_mod(), self._arrived, arg)

    def _arrived(
        self, x: tuple[DispatchInst, own.SendInstances[int, DispatchInst], Instance, list[str]]
    ) -> None:
        df, a, inst, leases = x
        self.add(a.owner, a.function, inst, leases)
        self.sim.at(self.sim.now + self.net.hop(), self._replied, (df, a.handover))

    def _replied(self, x: tuple[DispatchInst, int]) -> None:
        df, handover = x
        key = (df.id, handover)
        self._left[key] -= 1
        if not self._left[key]:
            del self._left[key]
            self.perform(df, df.ownership.instances_sent(handover))

    def add(self, owner: DispatchInst, fn: int, inst: Instance, leases: list[str]) -> None:
        """ModInstance(OP_ADD) on ``owner``: a new routing entry for the
        instance (as the servicer builds one from the message), with the
        leases the previous owner reserved on it that were not released
        here meanwhile (``arrivals.join``, as ``Dispatcher.add``)."""
        new = Instance(
            inst.instance_id, inst.address, inst.node_id, inst.concurrency, meta=inst.meta
        )
        self._join(fn, self.m.front.router(fn), new, False, owner.ownership.unreleased(leases))

    def _join(
        self, fn: int, router: FunctionRouter, inst: Instance, cold: bool, leases: list[str] | None
    ) -> None:
        new, grants = arrivals.join(router, inst, cold, leases)
        if new:
            self.m.scaling.added(fn, inst)
        if grants:
            self.m.front.serve_all(grants)

    def instance_ready(
        self, df: DispatchInst, fn: int, inst: Instance, started: FunctionRouter | None
    ) -> None:
        """A start ``df`` asked for (on router ``started``) is ready there:
        ``arrivals.decide`` says where it goes, as in ``Dispatcher.add``.
        When ``started`` was dropped meanwhile, it first serves the waiters
        ``started`` kept for it; then it goes to the owner with their
        leases, joins the router ``df`` has now, or is stopped."""
        owner = self.m.control.dispatch_owner(fn)
        current = self.m.front.routers[fn]
        a = arrivals.decide(started, current, None if owner is df else owner, cold=True)
        leases: list[str] = []
        if a.late and started is not None:
            actions, leases = df.ownership.start_done(fn, started, inst)
            self.perform(df, actions)
        if a.owner is not None:
            t = self.sim.now + self.net.hop()
            self.sim.stage(t, owner.station, self.s_mod(), self._late, (owner, fn, inst, leases))
        elif a.route is None:
            self.m.delete_on_node(inst.meta, inst.instance_id, self.m.a_delete())
        elif a.late:  # a new routing entry, as for a handed-over instance
            self.add(df, fn, inst, leases)
        else:
            self._join(fn, a.route, inst, a.cold, None)

    def late_failure(self, df: DispatchInst, fn: int, old: FunctionRouter) -> None:
        """A start ``df`` asked for (on ``old``) failed after ``old`` was
        dropped: the waiters no start covers now go to the owner (``df``
        itself when the function came back: they queue on its new router)."""
        owner = self.m.control.dispatch_owner(fn)
        self.perform(df, df.ownership.start_failed(fn, old, owner))

    def _late(self, x: tuple[DispatchInst, int, Instance, list[str]]) -> None:
        self.add(x[0], x[1], x[2], x[3])

    def _forwarded(self, req: Any) -> None:
        assert isinstance(req, Req)
        self.m.front.redispatch(req)
