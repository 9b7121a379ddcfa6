"""The scale-up path of the Galaxy model: Dispatch -> Schedule -> node agent.

A ``ScaleUp`` is one instance start. Its attempt loop is production's
(``functions.dispatch.attempts.StartAttempts``): a credit first, then the
Schedule instances ranked for the function (owner first, then up to
``max_spill`` more on NoFit), then a retry once spent credits are back.
The Schedule instance steps its production ``PlacementPolicy`` as events
arrive: ``advance`` gives ProbeNodes (send the probes; each answer is the
node's status when its agent served the probe; feed them back with
``record_probe`` once all are in, as the servicer does), a Reservation
(ask the node to create the instance: ``confirm`` when it is ready,
``reject`` when the node's ``NodeCapacity`` refuses), or NoFit.

Costs: the two halves of an RPC's client-side CPU are charged on send and on
reply; the server side on receipt. Without the connection cache a call
first opens a channel (``connect_s`` of caller CPU and one round trip).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from functions.dispatch import attempts as at
from functions.dispatch.policy import FunctionRouter
from functions.schedule.model import NodeInfo, Placement, ProbeNodes, Reservation, Target
from simulator.cluster import SimNode
from simulator.galaxy.credits import CreditPath

if TYPE_CHECKING:
    from simulator.galaxy.control import DispatchInst, ScheduleInst
    from simulator.galaxy.model import GalaxyModel


class ScaleUp:
    """One instance start in flight."""

    __slots__ = (
        "answers",
        "asked",
        "attempts",
        "decide",
        "df",
        "fn",
        "iid",
        "latest",
        "left",
        "node",
        "node_seq",
        "pl",
        "probe_t0",
        "res",
        "router",
        "sf",
        "t_begin",
        "targets",
    )

    def __init__(self, df: DispatchInst, fn: int, asked: float) -> None:
        self.df = df
        self.fn = fn
        self.asked = asked
        #: its attempt loop (production's core; set by ``Placer.start``)
        self.attempts: at.StartAttempts[ScheduleInst] | None = None
        self.sf: ScheduleInst | None = None
        self.pl: Placement | None = None
        self.targets: tuple[Target, ...] = ()
        self.answers: list[NodeInfo] = []
        self.left = 0
        self.latest = 0.0
        self.res: Reservation | None = None
        self.iid = ""
        self.node: SimNode | None = None
        self.node_seq = 0
        self.probe_t0 = 0.0
        self.t_begin = 0.0
        self.decide = 0.0
        #: the router that counted this start pending (Dispatch's ``_add``)
        self.router: FunctionRouter | None = None


class Placer:
    """Moves ScaleUps between Dispatch, Schedule and node agents."""

    def __init__(self, model: GalaxyModel) -> None:
        self.m = model
        env = model.env
        self.sim, self.net, self.rec = env.sim, env.net, env.rec
        self.by_id = env.cluster.by_id
        cfg = model.cfg
        self.cached = cfg.connection_cache
        # Opening a channel costs the caller CPU (and a round trip, below).
        self.connect = 0.0 if self.cached else env.cal.param("connect_s")
        self.s_scale_up = env.op("dispatch.scale_up", 0.5)
        self.s_schedule = env.op("schedule.schedule")
        self.s_decide = env.op("schedule.decide")
        self.s_probe = env.op("schedule.probe", 0.5)
        self.s_create = env.op("schedule.create", 0.5)
        self.a_probe = env.op("agent.probe")
        self.a_create = env.op("agent.create")
        # Bound once: each placement schedules them.
        self._on_begin, self._on_probed = self._begin, self._probed
        self._on_create, self._on_confirmed = self._create, self._confirmed
        #: capacity credits: scale-ups that fit one skip Schedule
        #: (none when functions have models: as in production, a start of a
        #: function with a model goes through Schedule, functions.dispatch.peers)
        self.credits = CreditPath(self) if cfg.credits and env.models is None else None

    def _call(self) -> float:
        """Network time of an RPC's request leg (a new connection first
        pays a round trip for its handshake)."""
        hop = self.net.hop
        return hop() if self.cached else hop() + hop() + hop()

    # -- Dispatch side --------------------------------------------------------

    def start(self, df: DispatchInst, fn: int, router: FunctionRouter) -> ScaleUp:
        """Dispatch starts one instance of fn, counted pending on ``router``:
        the steps of production's attempt loop (``attempts.StartAttempts``),
        as events."""
        su = ScaleUp(df, fn, self.sim.now)
        su.router = router
        wallet = df.wallet if self.credits is not None else None
        su.attempts = at.StartAttempts(
            "an instance",
            functools.partial(self.m.control.schedule_ranked, fn),
            self.m.cfg.max_spill,
            wallet.room_retry if wallet is not None else None,
        )
        self.rec.asked(self.sim.now)
        self.step(su)
        return su

    def step(self, su: ScaleUp) -> None:
        """Perform su's next step (after the outcome of the last one)."""
        loop = su.attempts
        assert loop is not None
        step = loop.next(routed=su.router is self.m.front.routers[su.fn])
        if isinstance(step, at.UseCredit):
            assert self.credits is not None
            if not self.credits.start(su, step.ranked[0].id if step.ranked else ""):
                loop.no_credit()
                self.step(su)
        elif isinstance(step, at.AskSchedule):
            self._send(su, step)
        elif isinstance(step, at.ReturnCredits):
            assert self.credits is not None
            self.credits.after_returns(su)
        elif isinstance(step, at.Pause):
            self.sim.at(self.sim.now + step.seconds, self.step, su)
        else:
            self.m.scale_up_failed(su)

    def _send(self, su: ScaleUp, step: at.AskSchedule[ScheduleInst]) -> None:
        sf = su.sf = step.schedule
        self.m.control.critical["schedule"] += 1
        if step.spill:
            self.rec.count("spills")
        t = su.df.station.finish(self.sim.now, self.s_scale_up() + self.connect) + self._call()
        # The policy's own computing (begin/advance/choose) ends the
        # Schedule RPC's work; the servicer's scheduling latency starts there.
        su.decide = self.s_decide()
        service = self.s_schedule() + su.decide
        self.sim.stage(max(t, sf.ready_at), sf.station, service, self._on_begin, su)

    def _no_fit(self, su: ScaleUp) -> None:
        self.sim.reply(
            self.sim.now + self.net.hop(), su.df.station, self.s_scale_up(), self._spill, su
        )

    def _spill(self, su: ScaleUp) -> None:
        """Schedule answered RESOURCE_EXHAUSTED."""
        assert su.attempts is not None and su.sf is not None
        su.attempts.failed("RESOURCE_EXHAUSTED", su.sf.id)
        self.step(su)

    # -- Schedule side --------------------------------------------------------

    def _begin(self, su: ScaleUp) -> None:
        assert su.sf is not None
        su.t_begin = self.sim.now - su.decide
        models = self.m.env.models
        if models is None:
            su.pl = su.sf.policy.begin(self.m.needs[su.fn])
        else:
            placing = models.placing(su.fn, self.m.fns[su.fn].name)
            su.pl = su.sf.policy.begin(self.m.needs[su.fn], placing)
        self._advance(su)

    def _advance(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.pl is not None
        step = su.sf.policy.advance(su.pl)
        if isinstance(step, Reservation):
            self._reserved(su, step)
        elif isinstance(step, ProbeNodes):
            self._probe(su, step)
        else:  # NoFit: RESOURCE_EXHAUSTED back to Dispatch, which spills
            self.sim.at(self.sim.now + self.net.hop(), self._no_fit, su)

    def _probe(self, su: ScaleUp, step: ProbeNodes) -> None:
        sf = su.sf
        assert sf is not None
        su.targets = step.targets
        su.left = len(step.targets)
        su.answers = []
        su.latest = 0.0
        su.probe_t0 = self.sim.now
        self.rec.count("probes", su.left)
        self.rec.count("probe_rounds")
        now = self.sim.now
        for tg in step.targets:
            node = self.by_id[tg.node_id]
            t = sf.station.then(now, self.s_probe() + self.connect) + self._call()
            self.sim.stage(t, node.agent, self.a_probe(), self._on_probed, (su, node))

    def _probed(self, a: tuple[ScaleUp, SimNode]) -> None:
        su, node = a
        # The answer is the node's status when its agent served the probe.
        models = self.m.env.models
        su.answers.append(node.info() if models is None else models.info(node.id, node.info()))
        back = self.sim.now + self.net.hop()
        su.latest = max(su.latest, back)
        su.left -= 1
        if su.left == 0:
            self.sim.at(su.latest, self._answers, su)

    def _answers(self, su: ScaleUp) -> None:
        assert su.sf is not None
        # The answers are messages like any other: they wait their turn in
        # Schedule's loop (a real probe's reply leg takes ~1.7 ms at 35% CPU,
        # measured; letting them jump the queue gave 0.2 ms).
        cost = sum(self.s_probe() for _ in su.answers)
        self.sim.reply(self.sim.now, su.sf.station, cost, self._record, su)

    def _record(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.pl is not None
        # Probe cost: the time this placement spent waiting for its probes.
        self.rec.add("probe_wait_s", self.sim.now - su.probe_t0)
        # Schedule's galaxy_probe_round_trip_seconds, per round.
        self.rec.sample("probe_round", su.asked, self.sim.now - su.probe_t0)
        policy = su.sf.policy
        for info in su.answers:
            policy.record_probe(su.pl, info.node_id, info)
        self._advance(su)

    def _reserved(self, su: ScaleUp, r: Reservation) -> None:
        assert su.sf is not None
        self.rec.scheduled(su.asked, self.sim.now)
        # What the Schedule servicer itself measures: its request to decision.
        self.rec.sample("schedule_decision", su.asked, self.sim.now - su.t_begin)
        su.res = r
        su.iid = self.m.new_id(su.fn)
        node = su.node = self.by_id[r.node_id]
        t = su.sf.station.then(self.sim.now, self.s_create() + self.connect) + self._call()
        self.sim.stage(t, node.agent, self.a_create(), self._on_create, su)

    # -- node side ------------------------------------------------------------

    def _create(self, su: ScaleUp) -> None:
        node = su.node
        assert node is not None
        if not self.m.env.cluster.allocate(node, su.iid, self.m.needs[su.fn]):
            self.rec.count("rejections")  # the node refused: the view was stale
            self.sim.at(self.sim.now + self.net.hop(), self._refused, su)
            return
        cold = self.m.fns[su.fn].cold_start_s
        models = self.m.env.models
        if models is not None:
            load = models.load_s(node.id, su.fn)
            self.rec.sample("model_load", self.sim.now, load)
            cold += load
        t = node.creator.finish(self.sim.now, cold)
        self.sim.at(t, self._ready, su)

    def _refused(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.res is not None
        t = su.sf.station.finish(self.sim.now, self.s_create())
        self.sim.at(t, self._rejected, su)

    def _rejected(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.res is not None
        su.sf.policy.reject(su.res)
        self._advance(su)

    def _ready(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.node is not None
        su.node_seq = self.m.env.cluster.ready(su.node, su.iid)
        self.rec.started(self.sim.now)
        t = self.sim.now + self.net.hop()
        self.sim.reply(t, su.sf.station, self.s_create(), self._on_confirmed, su)

    def _confirmed(self, su: ScaleUp) -> None:
        assert su.sf is not None and su.res is not None
        su.sf.policy.confirm(su.res, su.node_seq)
        t = self.sim.now + self.net.hop()
        self.sim.reply(t, su.df.station, self.s_scale_up(), self.m.instance_ready, su)
