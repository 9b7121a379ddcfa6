"""The controller scaling control functions on SRPS, in the Galaxy model.

Each tick (``report_s``) the simulated controller gathers what the load
reports would say -- per kind, the rate of its critical operation (Dispatch
requests, Schedule requests = SRPS, ClusterMgr node updates) and queue
depth -- and calls the production policy
``controlplane.controller.scaling.decide_all`` (one round of the reconcile
loop: a decision per kind at most); a decision adds instances (each
registers after ``control_start_s`` and the partitions change) or removes
one. T (the per-instance maximum throughput) is derived from the
calibration: the CPU one critical operation costs with the operations that
come with it (a Release per Dispatch; a CreateInstance and d probes per
Schedule request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.controller import scaling as policy

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
        self.config = policy.ScalingConfig(
            limits={
                k: policy.KindLimits(capacity=caps[k], max_instances=cp.cfg.max_instances)
                for k in policy.KINDS
            }
        )
        self.state = policy.ScalingState()
        self._seen = dict.fromkeys(policy.KINDS, 0)
        self._busy_until = dict.fromkeys(policy.KINDS, 0.0)
        self.decisions: list[tuple[float, str, int, int, str]] = []

    def tick(self) -> None:
        """One controller reconcile round."""
        cp = self.cp
        now = cp.sim.now
        loads = {}
        for kind in policy.KINDS:
            done = cp.m.front.requests if kind == "dispatch" else cp.critical[kind]
            rate = (done - self._seen[kind]) / cp.cfg.report_s
            self._seen[kind] = done
            if kind == "clustermgr" and cp.cfg.heartbeats == "changes":
                # Unchanged heartbeats are not simulated; every node still
                # sends one per period.
                rate = len(cp.env.cluster.nodes) / cp.cfg.heartbeat_s
            insts = cp.insts[kind]
            depth = sum(1 for i in insts.values() if i.station.backlog(now) > 0)
            loads[kind] = policy.KindLoad(
                len(insts), rate, depth, busy=now < self._busy_until[kind]
            )
        ctx = policy.ScalingContext(now, loads, self.config)
        decisions, self.state = policy.decide_all(ctx, self.state)
        for d in decisions:
            self.decisions.append((now, d.kind, d.current, d.desired, d.code))
            if d.delta > 0:
                for _ in range(d.delta):
                    cp.add(d.kind)
                self._busy_until[d.kind] = now + cp.start_s
            else:
                for _ in range(-d.delta):
                    cp.remove(d.kind)

    def describe(self) -> dict[str, object]:
        """For reports."""
        return {
            "policy": "controlplane.controller.scaling.decide",
            "T_per_instance": {k: round(v.capacity, 1) for k, v in self.config.limits.items()},
            "decisions": len(self.decisions),
        }


def make_control_scaling(cp: ControlPlane) -> ControlScaling | None:
    """The controller's scaling loop, when the configuration asks for it."""
    return ControlScaling(cp) if cp.cfg.controller_scaling else None
