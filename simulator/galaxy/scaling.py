"""The controller scaling control functions on SRPS, in the Galaxy model.

Each report (every ``report_s``, and at once when a check every
``burst_report_s`` finds a kind saturated, as ``LoadReporter`` does) the
simulated controller gathers what the load reports would say -- per kind,
the rate of its critical operation (Dispatch requests, Schedule requests =
SRPS, ClusterMgr node updates), queue depth and the busy cores of its
instances -- and calls the production policy
``controlplane.controller.scaling.decide_all`` (one round of the reconcile
loop: a decision per kind at most); a decision adds instances (each
registers after ``control_start_s`` and the partitions change) or removes
one. T (the per-instance maximum throughput) is derived from the
calibration: the CPU one critical operation costs with the operations that
come with it (a Release per Dispatch; a CreateInstance and d probes per
Schedule request).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from controlplane.controller import scaling as policy
from controlplane.controller.config import ControllerConfig
from controlplane.runtime.loadreport import report_due

if TYPE_CHECKING:
    from simulator.galaxy.control import ControlPlane


def capacities(cp: ControlPlane) -> dict[str, float]:
    """T per kind (ops/s one instance sustains) from the calibration."""
    cal, d = cp.env.cal, cp.cfg.d
    return {
        "dispatch": 1.0 / (cal.mean("dispatch.dispatch") + cal.mean("dispatch.release")),
        "schedule": 1.0
        / (
            cal.mean("schedule.schedule")
            + cal.mean("schedule.decide")
            + cal.mean("schedule.create")
            + d * cal.mean("schedule.probe")
        ),
        "clustermgr": 1.0 / cal.mean("clustermgr.update"),
    }


class ControlScaling:
    """Drives ``controller.scaling.decide`` from simulated load reports."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        caps = capacities(cp)
        # As the controller builds it, from the flags it would be given.
        ctl = ControllerConfig(max_instances=[f"{k}={cp.cfg.max_instances}" for k in policy.KINDS])
        self.config = ctl.scaling(caps)
        self.state = policy.ScalingState()
        self._seen = dict.fromkeys(policy.KINDS, 0)
        self._busy_until = dict.fromkeys(policy.KINDS, 0.0)
        #: per instance id, its station's busy seconds at the last tick (the
        #: process CPU a production load report carries)
        self._cpu_seen: dict[str, float] = {}
        #: per kind: when its load was last reported, the interval to the
        #: next report, and what the report said
        self._report_at: dict[str, float] = {}
        #: per kind: its instances' busy seconds at the last check
        self._checked: dict[str, float] = {}
        self.loads: dict[str, policy.KindLoad] = {}
        #: decisions made (a count: a list of them grew for the whole run)
        self.decisions = 0

    def tick(self) -> None:
        """One controller reconcile round, on the burst cadence.

        A kind's load report is refreshed every ``report_s``, and at once
        when its instances were saturated since the last check
        (``loadreport.report_due``); the policy runs when a report came in
        (between reports its inputs are unchanged).
        """
        cp = self.cp
        now = cp.sim.now
        fresh = False
        for kind in policy.KINDS:
            # The first report comes one interval after the start.
            last = self._report_at.get(kind, 0.0)
            if not report_due(now - last, cp.cfg.report_s, self._check_cpu(kind, now)):
                continue
            elapsed = now - last
            self._report_at[kind] = now
            self.loads[kind] = self._report(kind, now, elapsed)
            fresh = True
        if not fresh:
            return
        loads = {k: replace(kl, busy=now < self._busy_until[k]) for k, kl in self.loads.items()}
        ctx = policy.ScalingContext(now, loads, self.config)
        decisions, self.state = policy.decide_all(ctx, self.state)
        for d in decisions:
            self.decisions += 1
            if d.delta > 0:
                for _ in range(d.delta):
                    cp.add(d.kind)
                self._busy_until[d.kind] = now + cp.start_s
            else:
                for _ in range(-d.delta):
                    cp.remove(d.kind)

    def _check_cpu(self, kind: str, now: float) -> float:
        """Busy cores per instance of kind since the last check (each
        production reporter checks its own process; per kind here: the
        kind reports sooner when its instances were saturated on average)."""
        insts = self.cp.insts[kind]
        busy = sum(i.station.busy for i in insts.values())
        before = self._checked.get(kind, 0.0)
        self._checked[kind] = busy
        if not insts:
            return 0.0
        return (busy - before) / self.cp.cfg.burst_report_s / len(insts)

    def _report(self, kind: str, now: float, elapsed: float) -> policy.KindLoad:
        """What the kind's load reports say over the last ``elapsed`` seconds."""
        cp = self.cp
        done = cp.m.front.requests if kind == "dispatch" else cp.critical[kind]
        rate = (done - self._seen[kind]) / elapsed
        self._seen[kind] = done
        if kind == "clustermgr" and cp.cfg.heartbeats == "changes":
            # Unchanged heartbeats are not simulated; every node still
            # sends one per period.
            rate = len(cp.env.cluster.nodes) / cp.cfg.heartbeat_s
        insts = cp.insts[kind]
        depth = sum(1 for i in insts.values() if i.station.backlog(now) > 0)
        cpu = 0.0
        for iid, inst in insts.items():
            busy = inst.station.busy
            cpu += busy - self._cpu_seen.get(iid, 0.0)
            self._cpu_seen[iid] = busy
        cores = min(cpu / elapsed, float(len(insts)))
        return policy.KindLoad(len(insts), rate, depth, cpu=cores)

    def describe(self) -> dict[str, object]:
        """For reports."""
        return {
            "policy": "controlplane.controller.scaling.decide",
            "T_per_instance": {k: round(v.capacity, 1) for k, v in self.config.limits.items()},
            "decisions": self.decisions,
        }


def make_control_scaling(cp: ControlPlane) -> ControlScaling | None:
    """The controller's scaling loop, when the configuration asks for it."""
    return ControlScaling(cp) if cp.cfg.controller_scaling else None
