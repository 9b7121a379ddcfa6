"""Capacity credits in the Galaxy model: Dispatch -> node agent directly.

Each Dispatch instance holds a production ``CreditWallet`` and each Schedule
instance a production ``CreditLedger`` (over its ``PlacementPolicy``); this
module only moves their messages, with the same costs as the model's other
messages:

- a scale-up asks the wallet (``take``: ``dispatch.credit_take`` on
  Dispatch); on a hit, the decision is made there (scheduling latency ends;
  once the instance is created, its ``credit_decision`` sample is the take's
  own span on Dispatch, as ``functions.dispatch.peers`` times it for
  ``galaxy_scheduling_latency_seconds``), and Dispatch sends CreateInstance to the node's
  agent as a message on its InstanceStream, and the agent answers on it
  (``simulator.galaxy.streams``: batched writes as production's; per message
  ``dispatch.credit_create`` on Dispatch, half each way, and
  ``agent.stream_create`` on the agent; per write and per read
  ``dispatch.stream_write`` / ``agent.stream_write``); the agent allocates
  or refuses (``NodeCapacity``), a refusal going back to the normal
  Schedule path;
- after every take (and on a periodic upkeep tick), due exchanges with
  Schedule instances (``GrantCredits``: reports, returns, the refill) run
  off the critical path: a unary call's client CPU each way on Dispatch
  (``schedule.probe``: the echo's client CPU per call) and a Schedule RPC's
  server CPU (``schedule.schedule``) plus one decision per credit asked on
  Schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from functions.dispatch.credits import CreditUse, CreditWallet, SyncRequest
from functions.schedule.credits import Grant
from simulator.engine import Station
from simulator.galaxy.streams import Stream

if TYPE_CHECKING:
    from simulator.galaxy.control import ControlPlane, DispatchInst, ScheduleInst
    from simulator.galaxy.placement import Placer, ScaleUp


def make_wallet(cp: ControlPlane) -> CreditWallet | None:
    """A Dispatch instance's wallet (None with credits off)."""
    c = cp.cfg
    if not c.credits:
        return None
    return CreditWallet(
        target=c.credit_target, floor=c.credit_floor, shrink_s=c.credit_shrink_s,
        renew_s=c.credit_renew_s, idle_s=c.credit_idle_s,
        max_starting=c.credit_max_starting, clock=cp.sim.clock,
    )  # fmt: skip


def on_membership(cp: ControlPlane) -> None:
    """After a membership change: Schedule instances drop credits on nodes
    that left their partition, and those of Dispatch instances that left
    (as the servicers do). Dispatch instances drop theirs in
    ``Handovers.membership_changed``."""
    for sf in cp.sfs.values():
        if sf.ledger is not None:
            sf.ledger.retain()
            for holder in sf.ledger.holders() - cp.dfs.keys():
                sf.ledger.drop_holder(holder)  # a Dispatch instance that left


class CreditPath:
    """The credit half of the scale-up path (see the module docstring)."""

    def __init__(self, placer: Placer) -> None:
        self.p = placer
        self.m = placer.m
        env = self.m.env
        self.sim, self.net, self.rec = placer.sim, placer.net, placer.rec
        self.s_take = env.op("dispatch.credit_take")
        self.s_call = env.op("schedule.probe", 0.5)
        self.s_create = env.op("dispatch.credit_create", 0.5)
        self.a_create = env.op("agent.stream_create")
        self.d_write = env.op("dispatch.stream_write")
        self.a_write = env.op("agent.stream_write")
        #: each Dispatch instance's InstanceStream to each agent, both ways
        self._streams: dict[tuple[Station, Station], tuple[Stream, Stream]] = {}
        self._on_create, self._on_ready = self._create, self._ready
        #: starts refused for room waiting for their Dispatch's returns
        self._after_returns: dict[str, list[ScaleUp]] = {}

    def start(self, su: ScaleUp, home: str) -> bool:
        """Serve su from a credit if one fits (True), else leave it to
        Schedule; ``home`` is the first ranked Schedule instance."""
        df, p = su.df, self.p
        wallet = df.wallet
        assert wallet is not None
        use = wallet.take(self.m.needs[su.fn], self.m.fns[su.fn].name)
        now = self.sim.now
        take = self.s_take()
        t = df.station.finish(now, take)
        self.sync(df, home, t, upkeep=False)
        if use is None:
            self.rec.count("credit_misses")
            return False
        self.rec.count("credit_hits")
        self.rec.scheduled(su.asked, t)
        # Production times the take alone: from its start on a core (a wait
        # for the core comes before it) to its end, preemptions within it
        # included (the host's ``began``).
        host = df.station.host
        su.decide = t - host.began if host is not None else take
        su.iid = self.m.new_id(su.fn)
        node = su.node = p.by_id[use.node_id]
        out, _ = self.streams(df.station, node.agent)
        out.send(
            t,
            self.s_create() + p.connect,
            self.a_create(),
            self._on_create,
            (su, use),
            follows=True,
        )
        return True

    def streams(self, dispatch: Station, agent: Station) -> tuple[Stream, Stream]:
        """The InstanceStream between a Dispatch instance and an agent:
        requests, replies (opened at first use)."""
        pair = self._streams.get((dispatch, agent))
        if pair is None:
            hop = self.net.hop
            pair = self._streams[(dispatch, agent)] = (
                Stream(self.sim, hop, dispatch, agent, self.d_write, self.a_write),
                Stream(self.sim, hop, agent, dispatch, self.a_write, self.d_write, reply=True),
            )
        return pair

    def _create(self, a: tuple[ScaleUp, CreditUse]) -> None:
        su, use = a
        node = su.node
        assert node is not None
        if not self.m.env.cluster.allocate(node, su.iid, use.need):
            self.rec.count("credit_refused")
            _, back = self.streams(su.df.station, node.agent)
            back.send(self.sim.now, 0.0, self.s_create(), self._refused, a)
            return
        t = node.creator.finish(self.sim.now, self.m.fns[su.fn].cold_start_s)
        self.sim.at(t, self._on_ready, a)

    def _refused(self, a: tuple[ScaleUp, CreditUse]) -> None:
        su, use = a
        assert su.df.wallet is not None
        su.df.wallet.settled(use, None, refused=True)
        su.node = None
        self.sync(su.df, "", self.sim.now, upkeep=False)
        assert su.attempts is not None
        su.attempts.no_credit()  # the normal path: Schedule places it
        self.p.step(su)

    def _ready(self, a: tuple[ScaleUp, CreditUse]) -> None:
        su, use = a
        assert su.node is not None
        seq = self.m.env.cluster.ready(su.node, su.iid)
        self.rec.started(self.sim.now)
        _, back = self.streams(su.df.station, su.node.agent)
        back.send(self.sim.now, 0.0, self.s_create(), self._created, (su, use, seq))

    def _created(self, a: tuple[ScaleUp, CreditUse, int]) -> None:
        su, use, seq = a
        assert su.df.wallet is not None
        # Observed once created, as Dispatch observes it.
        self.rec.sample("credit_decision", su.asked, su.decide)
        # The report goes with the next exchange (a refill, or the upkeep
        # tick): until then the hold still counts the instance.
        su.df.wallet.settled(use, seq)
        self.m.instance_ready(su)

    # -- GrantCredits exchanges -------------------------------------------------

    def sync(self, df: DispatchInst, home: str, t: float, upkeep: bool = True) -> None:
        """Start the exchanges due (the caller's process is free at t)."""
        wallet = df.wallet
        assert wallet is not None
        for g in wallet.due(home, upkeep=upkeep):
            req = wallet.begin_sync(g)
            sf = self.m.control.sfs.get(g)
            if sf is None or sf.ledger is None:  # the grantor is gone
                wallet.end_sync(req, None)
                continue
            self.rec.count("credit_syncs")
            t = df.station.then(t, self.s_call()) + self.p._call()
            service = self.p.s_schedule() + sum(self.p.s_decide() for _ in range(req.want))
            self.sim.stage(t, sf.station, service, self._granted, (df, sf, req))

    def _granted(self, a: tuple[DispatchInst, ScheduleInst, SyncRequest]) -> None:
        df, sf, req = a
        assert sf.ledger is not None
        grants = sf.ledger.sync(df.id, req.used, req.returned, req.want)
        t = self.sim.now + self.net.hop()
        self.sim.reply(t, df.station, self.s_call(), self._synced, (df, req, grants))

    def _synced(self, a: tuple[DispatchInst, SyncRequest, list[Grant]]) -> None:
        df, req, grants = a
        assert df.wallet is not None
        alive = req.grantor in self.m.control.sfs
        df.wallet.end_sync(req, grants if alive else None)
        if self._after_returns.get(df.id):
            self._returned(df)

    def after_returns(self, su: ScaleUp) -> None:
        """Retry su (refused for room) once its Dispatch instance's spent
        credits are back with their grantors: they are sent now, and any
        queued behind an exchange in flight as soon as it ends (as
        ``Peers.return_credits``)."""
        self._after_returns.setdefault(su.df.id, []).append(su)
        assert su.df.wallet is not None
        su.df.wallet.return_all()
        self._returned(su.df)

    def _returned(self, df: DispatchInst) -> None:
        wallet = df.wallet
        assert wallet is not None
        self.sync(df, "", self.sim.now, upkeep=True)
        if not wallet.returns_outstanding():
            for su in self._after_returns.pop(df.id, []):
                self.p.step(su)  # a new round: a credit first, then Schedule

    def tick(self) -> None:
        """Periodic upkeep: return credits of idle or soon-expiring holders."""
        for df in list(self.m.control.dfs.values()):
            w = df.wallet
            if w is not None and (w.credits() or w.returns_pending()):
                self.sync(df, "", self.sim.now)
