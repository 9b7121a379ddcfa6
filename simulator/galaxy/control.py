"""Control function instances, membership, node heartbeats and ModNode.

Membership is the production ``ControlRegistry`` (the controller's) and
owners come from a ``MembershipView`` (rendezvous hashing). Each ClusterMgr
instance holds a production ``NodeRegistry``: a node heartbeats to the
ClusterMgr instance that owns it, which records the status and forwards it
(ModNodes calls, batched as production's outbox batches them:
``simulator.galaxy.modnodes``) to the Schedule instance that owns the node,
whose ``PlacementPolicy.upsert`` takes it. On a membership change, Schedule
instances ``retain`` only their partition, ClusterMgr re-sends the nodes
whose owner changed (``NodeRegistry.set_membership``), as the servicers do,
and a node that moved to another ClusterMgr instance registers there
(one RegisterNode call from its agent).
"""

from __future__ import annotations

import functools
import math
import random
from typing import TYPE_CHECKING, Any

from controlplane.controller.registry import ControlRegistry, State
from controlplane.controller.scaling import scale_in_victim
from controlplane.runtime.membership import MembershipView
from functions.clustermgr.config import DEAD_AFTER_BEATS
from functions.clustermgr.forwarding import HeartbeatForwarding
from functions.clustermgr.policy import NodeRegistry, Updated
from functions.dispatch.ownership import Ownership
from functions.schedule import factory as schedule_factory
from functions.schedule.model import NodeInfo
from functions.schedule.policy import PlacementPolicy
from functions.schedule.service import node_info
from galaxy.v1 import common_pb2
from simulator.cluster import SimNode
from simulator.engine import Station
from simulator.galaxy import credits
from simulator.galaxy.modnodes import ModNodes
from simulator.galaxy.scaling import make_control_scaling

if TYPE_CHECKING:
    from functions.dispatch.credits import Credit, CreditWallet
    from functions.schedule.credits import CreditLedger
    from simulator.galaxy.model import GalaxyModel

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH
SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE
CLUSTERMGR = common_pb2.CONTROL_KIND_CLUSTERMGR
KINDS = {"dispatch": DISPATCH, "schedule": SCHEDULE, "clustermgr": CLUSTERMGR}
_GOLDEN = 0.6180339887498949


class ControlInst:
    """One control function instance: a process (station) with an id."""

    kind = ""

    def __init__(self, iid: str, station: Station) -> None:
        self.id = iid
        self.station = station
        self.ops_seen = 0
        self.busy_seen = 0.0


class DispatchInst(ControlInst):
    """A Dispatch instance and its production protocol core (its routers
    live in the model's ``Frontend``: one routing table, as a function has
    one owner at a time)."""

    kind = "dispatch"
    #: its capacity credits (``simulator.galaxy.credits``; None: off)
    wallet: CreditWallet | None = None

    def __init__(self, iid: str, station: Station) -> None:
        super().__init__(iid, station)
        self.ownership: Ownership[int, DispatchInst] = Ownership()


class ScheduleInst(ControlInst):
    """A Schedule instance and its production placement policy."""

    kind = "schedule"

    def __init__(self, iid: str, station: Station, policy: PlacementPolicy) -> None:
        super().__init__(iid, station)
        self.policy = policy
        #: it takes placements once it has filled its node table
        self.ready_at = 0.0
        #: the credits it lent (``simulator.galaxy.credits``; None: off)
        self.ledger: CreditLedger | None = None


class ClusterMgrInst(ControlInst):
    """A ClusterMgr instance and its production node registry."""

    kind = "clustermgr"

    def __init__(
        self,
        iid: str,
        station: Station,
        registry: NodeRegistry,
        heartbeat_s: float,
        covered_linger_s: float | None = None,
    ) -> None:
        super().__init__(iid, station)
        self.registry = registry
        self.forwarding = HeartbeatForwarding(heartbeat_s, covered_linger_s=covered_linger_s)


class ControlPlane:
    """Instances of the three control functions and the plumbing between them."""

    def __init__(self, model: GalaxyModel) -> None:
        self.m = model
        env = model.env
        self.env, self.sim, self.net, self.rec = env, env.sim, env.net, env.rec
        self.cfg = model.cfg
        #: what each Schedule instance's policy and ledger are built from
        self._schedule_cfg = model.cfg.schedule_config()
        self.registry = ControlRegistry(self.sim.clock)
        self.view = MembershipView()
        self.dfs: dict[str, DispatchInst] = {}
        self.sfs: dict[str, ScheduleInst] = {}
        self.cmfs: dict[str, ClusterMgrInst] = {}
        #: the three by kind name (for code that treats every kind alike)
        self.insts: dict[str, dict[str, Any]] = {
            "dispatch": self.dfs,
            "schedule": self.sfs,
            "clustermgr": self.cmfs,
        }
        self._serial = {k: 0 for k in KINDS}
        #: warm standbys ready per kind (started, registered, in no view)
        self.standby = dict.fromkeys(KINDS, self.cfg.standby)
        #: operations done per kind: what load reports are computed from
        self.critical = dict.fromkeys(KINDS, 0)
        self._df_cache: list[DispatchInst | None] = [None] * len(env.workload.functions)
        #: per function, the process of its Dispatch owner once asked (None:
        #: not yet); emptied in place on a membership change, so the model's
        #: ``Frontend.owners`` can be this very list
        self.dispatch_stations: list[Station | None] = [None] * len(env.workload.functions)
        self._sf_cache: dict[int, list[ScheduleInst]] = {}
        self._cmf_cache: list[ClusterMgrInst | None] = [None] * len(env.cluster.nodes)
        #: node id -> id of the Schedule instance owning it ("" for none)
        self._sf_owner: dict[str, str] = {}
        self.s_update = env.op("clustermgr.update")
        self.s_agent_beat = env.op("agent.heartbeat")
        self.repartition_s = env.cal.param("repartition_s", 0.03)
        self.start_s = env.cal.param("control_start_s", 1.0)
        self._rng = random.Random(env.rng.random())
        # Bound once (heartbeats schedule them by the hundred thousand).
        self._on_update = self._update
        # ClusterMgr's ModNodes calls (how long each status may wait for
        # company: each ClusterMgr instance's ``HeartbeatForwarding``).
        self.modnodes = ModNodes(self)
        #: membership changes after the first one are charged (the first
        #: builds the tables "as registration leaves them", before the run)
        self._live = False
        for kind in KINDS:
            for _ in range(self.cfg.instances):
                self._register(self._make(kind))
        self._apply(self.registry.membership())
        self._live = True
        self.scaler = make_control_scaling(self)

    # -- instances ------------------------------------------------------------

    def _make(self, kind: str) -> ControlInst:
        iid = f"{kind}-{self._serial[kind]}"
        self._serial[kind] += 1
        st = self.env.station(iid)
        if kind == "schedule":
            pol = schedule_factory.make_policy(
                self._schedule_cfg,
                iid,
                clock=self.sim.clock,
                rng=random.Random(self._rng.random()),
            )
            sf = ScheduleInst(iid, st, pol)
            sf.ledger = schedule_factory.make_ledger(self._schedule_cfg, pol, clock=self.sim.clock)
            return sf
        if kind == "clustermgr":
            dead_after_s = DEAD_AFTER_BEATS * self.cfg.heartbeat_s
            reg = NodeRegistry(dead_after_s=dead_after_s, clock=self.sim.clock)
            return ClusterMgrInst(iid, st, reg, self.cfg.heartbeat_s, self.cfg.covered_linger_s)
        df = DispatchInst(iid, st)
        df.wallet = credits.make_wallet(self)
        return df

    def _register(self, inst: ControlInst) -> None:
        self.insts[inst.kind][inst.id] = inst
        n = len(self.insts[inst.kind])
        port = 9000 + n
        self.registry.register(
            common_pb2.ControlInstance(id=inst.id, kind=KINDS[inst.kind], address=f"cp:{port}")
        )
        self.rec.control_instances(self.sim.now, inst.kind, n)

    def add(self, kind: str) -> None:
        """Start one more instance: it registers once its process is up, or
        at once when a warm standby is promoted (and a replacement starts)."""
        inst = self._make(kind)
        self.rec.count(f"control_added.{kind}")

        def up(_: object) -> None:
            self._register(inst)
            if isinstance(inst, ScheduleInst):
                inst.ready_at = self.sim.now + self.repartition_s
            self._apply(self.registry.membership())

        if self.standby[kind] > 0:
            self.standby[kind] -= 1
            self.rec.count(f"standby_promoted.{kind}")
            up(None)
            self.sim.after(self.start_s, self._standby_up, kind)
            return
        self.sim.after(self.start_s, up)

    def _standby_up(self, kind: str) -> None:
        self.standby[kind] += 1

    def remove(self, kind: str) -> None:
        """Stop the instance the controller's core picks (``scale_in_victim``:
        of the READY ones, the newest started, as the local actuator offers
        them); never the last one."""
        live = self.insts[kind]
        if len(live) <= 1:
            return
        ready = [m.info.id for m in self.registry.members(KINDS[kind], State.READY)]
        newest_first = sorted(live, key=lambda i: int(i.rsplit("-", 1)[1]), reverse=True)
        iid = scale_in_victim(ready, newest_first)
        if iid is None:
            return
        routed = self._routed_owners()  # while the leaving one is still known
        gone = live.pop(iid)
        self.rec.add(f"cpu_s.{kind}", gone.station.busy)
        self.registry.deregister(KINDS[kind], iid)
        self.rec.count(f"control_removed.{kind}")
        self.rec.control_instances(self.sim.now, kind, len(live))
        self._apply(self.registry.membership(), routed)

    # -- membership -----------------------------------------------------------

    def _routed_owners(self) -> dict[int, DispatchInst]:
        """The Dispatch owner of every function that has a router."""
        routers = self.m.front.routers
        return {fn: self.dispatch_owner(fn) for fn, r in enumerate(routers) if r is not None}

    def _apply(
        self, m: common_pb2.Membership, routed: dict[int, DispatchInst] | None = None
    ) -> None:
        """Every instance adopts membership m (as Coordinate pushes it)."""
        if routed is None:
            routed = self._routed_owners()
        self.view.update(m)
        self._df_cache = [None] * len(self._df_cache)
        self.dispatch_stations[:] = [None] * len(self._df_cache)
        self._sf_cache.clear()
        self._cmf_cache = [None] * len(self._cmf_cache)
        self._sf_owner.clear()
        for sf in self.sfs.values():
            sf.policy.retain(functools.partial(self._owns, sf.id))
        for cmf in self.cmfs.values():
            changes = cmf.registry.set_membership(m) or []
            for c in changes:
                rec = cmf.registry.get(c.node_id)
                if rec is not None and c.new:
                    # Through the outbox, which batches them (up to 64 per
                    # ModNodes call), as ``apply_membership`` queues them.
                    self.modnodes.put(cmf, self.sfs[c.new], rec.status)
            for nid in cmf.registry.not_mine(cmf.id):
                cmf.registry.forget(nid)
                cmf.forwarding.forget(nid)
        # Nodes new to their ClusterMgr instance register there, after it
        # adopted the membership (so their owner is the new one, as for an
        # agent's RegisterNode reaching a ClusterMgr that has it).
        for node in self.env.cluster.nodes:
            cmf = self.clustermgr_owner(node)
            if cmf.registry.get(node.id) is None:
                cmf.registry.register(node.status())
                if self._live:
                    self._reregister(cmf, node)
        # Credits on partitions that moved are dropped (both sides), and
        # functions whose owner changed are handed over by their previous
        # owner's protocol core, as events, as the servicers do.
        credits.on_membership(self)
        self.m.handovers.membership_changed(self, routed)

    def _reregister(self, cmf: ClusterMgrInst, node: SimNode) -> None:
        """A node moved to cmf: its agent makes one RegisterNode call (an
        agent's unary call, as a heartbeat was when calibrated; handled
        like a heartbeat that changed the status), after which cmf tells
        the node's Schedule owner (``ClusterMgrServicer.RegisterNode``)."""
        self.rec.count("reregistrations")
        cmf.forwarding.sent(node.id, self.sim.now)  # (RegisterNode: the owner has it)
        t = node.agent.finish(self.sim.now, self.s_agent_beat()) + self.net.hop()
        self.sim.stage(t, cmf.station, self.s_update(), self._registered, (cmf, node.id))

    def _registered(self, a: tuple[ClusterMgrInst, str]) -> None:
        cmf, node_id = a
        rec = cmf.registry.get(node_id)
        sf = self.sfs.get(rec.owner) if rec is not None else None
        if rec is not None and sf is not None and self.cmfs.get(cmf.id) is cmf:
            self.modnodes.put(cmf, sf, rec.status)

    def _owns(self, sf_id: str, node_id: str) -> bool:
        return self._sf_owner_id(node_id) == sf_id

    def grantor_owns(self, credit: Credit) -> bool:
        """True while a credit's grantor still owns its node."""
        return self._sf_owner_id(credit.node_id) == credit.grantor

    def _sf_owner_id(self, node_id: str) -> str:
        # Cached: every node status update asks (the cache is reset when
        # the membership changes).
        sf = self._sf_owner.get(node_id)
        if sf is None:
            o = self.view.owner(SCHEDULE, node_id)
            sf = self._sf_owner[node_id] = o.id if o is not None else ""
        return sf

    def dispatch_owner(self, fn: int) -> DispatchInst:
        """The Dispatch instance owning function fn (rendezvous)."""
        d = self._df_cache[fn]
        if d is None:
            o = self.view.owner(DISPATCH, self.m.fns[fn].name)
            assert o is not None
            d = self._df_cache[fn] = self.dfs[o.id]
        assert d is not None
        return d

    def dispatch_station(self, fn: int) -> Station:
        """The process of fn's owning Dispatch instance (hot path: cached)."""
        st = self.dispatch_stations[fn]
        if st is None:
            st = self.dispatch_stations[fn] = self.dispatch_owner(fn).station
        return st

    def schedule_ranked(self, fn: int) -> list[ScheduleInst]:
        """Schedule instances in spill order for function fn."""
        r = self._sf_cache.get(fn)
        if r is None:
            ranked = self.view.ranked(SCHEDULE, self.m.fns[fn].name)
            r = self._sf_cache[fn] = [self.sfs[i.id] for i in ranked]
        return r

    def clustermgr_owner(self, node: SimNode) -> ClusterMgrInst:
        """The ClusterMgr instance a node reports to."""
        c = self._cmf_cache[node.index]
        if c is None:
            o = self.view.owner(CLUSTERMGR, node.id)
            assert o is not None
            c = self._cmf_cache[node.index] = self.cmfs[o.id]
        assert c is not None
        return c

    # -- heartbeats -----------------------------------------------------------

    def start(self) -> None:
        """Initial node tables (as registration leaves them), heartbeats,
        load reports."""
        for node in self.env.cluster.nodes:
            sf = self.sfs[self._sf_owner_id(node.id)]
            sf.policy.upsert(node_info(node.status()))
        self.env.cluster.on_change = self._changed
        if self.cfg.exact:
            # Production's node agent reports a node right after a free
            # (``Registrar.report_soon``): exact partitions rely on it.
            self.env.cluster.on_free = self._push
        if self.cfg.heartbeats == "all":
            for node in self.env.cluster.nodes:
                self.sim.at(self._phase(node), self._beat, node)
        if self.scaler is not None:
            self.sim.every(self.cfg.burst_report_s, self.scaler.tick)

    def finish(self) -> None:
        """Final samples, and the CPU the control functions spent (overhead)."""
        self.rec.count("modnodes_calls", self.modnodes.calls)
        self.rec.count("modnodes_sent", self.modnodes.sent)
        for kind, live in self.insts.items():
            self.rec.control_instances(self.sim.now, kind, len(live))
            self.rec.add(f"cpu_s.{kind}", sum(i.station.busy for i in live.values()))
        self.rec.add("cpu_s.control", sum(self.rec.sums[f"cpu_s.{k}"] for k in KINDS))

    def _phase(self, node: SimNode) -> float:
        # Spread heartbeats over the period, as the agent's Registrar does.
        return ((node.index * _GOLDEN) % 1.0) * self.cfg.heartbeat_s

    def _changed(self, node: SimNode) -> None:
        if node.status_due or self.cfg.heartbeats == "all":
            return
        node.status_due = True
        hb, now = self.cfg.heartbeat_s, self.sim.now
        ph = self._phase(node)
        t = ph + math.ceil((now - ph) / hb) * hb
        self.sim.at(t if t > now else t + hb, self._beat_due, (node, node.beat_token))

    def _beat_due(self, a: tuple[SimNode, int]) -> None:
        node, token = a
        if token == node.beat_token:  # not sent early by a push since
            self._beat(node)

    def _push(self, node: SimNode) -> None:
        """Report now (a free): replaces a scheduled report, and reports
        asked at the same moment go as one."""
        node.beat_token += 1
        node.status_due = True
        self.sim.at(self.sim.now, self._beat_due, (node, node.beat_token))

    def _beat(self, node: SimNode) -> None:
        node.status_due = False
        node.beat_token += 1
        self.critical["clustermgr"] += 1
        cmf = self._cmf_cache[node.index] or self.clustermgr_owner(node)
        t = node.agent.finish(self.sim.now, self.s_agent_beat()) + self.net.hop()
        # The status as sent, and as Schedule's ModNode handler converts it
        # (``node_info``: the same values, taken here from the node, which
        # is cheaper than converting the message).
        models = self.env.models
        info = node.info() if models is None else models.info(node.id, node.info())
        a = (cmf, node.status(), info)
        self.sim.stage(t, cmf.station, self.s_update(), self._on_update, a)
        if self.cfg.heartbeats == "all":
            self.sim.after(self.cfg.heartbeat_s, self._beat, node)

    def _update(self, a: tuple[ClusterMgrInst, common_pb2.NodeStatus, NodeInfo]) -> None:
        cmf, status, info = a
        known = cmf.registry.get(status.node_id)
        old = known.status if known is not None else None  # (update replaces it)
        out = cmf.registry.update(status)
        if out is Updated.UNKNOWN:
            cmf.registry.register(status)
            out = Updated.CHANGED  # registered now: its status is news to the owner
        elif out is Updated.STALE:
            return
        rec = cmf.registry.get(status.node_id)
        sf = self.sfs.get(rec.owner) if rec is not None else None
        # Production's rule (``HeartbeatForwarding``): news at once, a start
        # the owner counts and an unchanged status (once per refresh
        # period) may wait for company.
        if sf is None:
            return
        wait = cmf.forwarding.wait_s(out, old, status, self.sim.now)
        if wait is not None:
            self.modnodes.put(cmf, sf, status, info, wait_s=wait)

    def apply_modnode(self, a: tuple[ScheduleInst, common_pb2.NodeStatus, NodeInfo | None]) -> None:
        sf, status, info = a
        if info is None:
            info = node_info(status)
        # A Schedule instance only holds nodes of its partition (ModNode check).
        if self._sf_owner_id(info.node_id) == sf.id:
            sf.policy.upsert(info)
