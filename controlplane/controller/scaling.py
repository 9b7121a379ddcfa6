"""Scaling policy for the control functions (Dispatch, Schedule, ClusterMgr).

Pure: no I/O, no clock of its own. The reconcile loop gathers the load
reports into a ``ScalingContext`` (its time comes from an injected clock) and
calls ``decide(ctx, state) -> (decision, new_state)`` once per tick. At most
one decision comes out of a tick, and a kind with an action still in
progress (``KindLoad.busy``, or a target it decided that is not reached yet)
gets none: that is what keeps a burst from triggering redundant scale-outs.

The rule, per kind with per-instance maximum throughput T (T_DF, T_SF,
T_CMF) and n ready instances:

* utilization u = max(load / (n * T), cpu / n), where load is the summed
  ops/s of the kind's critical operation (``LOAD_OPS``) and cpu the summed
  busy cores its instances report (``KindLoad.cpu``);
* needed = ceil(max(load / T, cpu) / target_utilization), clamped to [min, max];
* u > high_watermark (and the scale-out cooldown has passed): scale out to
  max(n + 1, needed) in one step (a flood needs its instances now, not four
  a tick), and to at least ``saturated_growth`` x n when the instances are
  CPU-saturated (their reports are then censored at what they could do);
  ``max_step_out`` bounds the step when set;
* u < low_watermark continuously for ``scale_in_cooldown_s`` (and as long
  since the last action): scale in by one, unless the remaining instances
  would then run above target utilization;
* n outside [min, max] is corrected first; a kind with no ready instance
  yet is left alone (its deployment starts the first one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

#: The control function kinds the controller scales, by name.
KINDS = ("dispatch", "schedule", "clustermgr")

#: instances of one control kind at most unless ``--max-instances KIND=N``
#: says otherwise: the one place this limit is written (the controller, `galaxy
#: up` and the simulator all read it from here)
DEFAULT_MAX_INSTANCES = 8

#: The operation whose rate is a kind's load (what T is measured in):
#: Dispatch requests, Schedule requests (SRPS), ClusterMgr node updates.
LOAD_OPS: dict[str, str] = {
    "dispatch": "dispatch",
    "schedule": "schedule",
    "clustermgr": "node_update",
}

_NEVER = -math.inf


@dataclass(frozen=True)
class KindLimits:
    """Per-kind parameters: T (ops/s one instance sustains) and bounds."""

    capacity: float
    min_instances: int = 1
    max_instances: int = DEFAULT_MAX_INSTANCES

    def __post_init__(self) -> None:
        if not self.capacity > 0:
            raise ValueError(f"capacity (T) must be > 0, got {self.capacity}")
        if self.min_instances < 1:
            raise ValueError("min_instances must be >= 1: a control function must run")
        if self.max_instances < self.min_instances:
            raise ValueError(
                f"max_instances ({self.max_instances}) < min_instances ({self.min_instances})"
            )


@dataclass(frozen=True)
class ScalingConfig:
    """Knobs of the policy; see the module docstring for how they combine."""

    limits: Mapping[str, KindLimits]
    target_utilization: float = 0.6
    high_watermark: float = 0.8
    low_watermark: float = 0.3
    scale_out_cooldown_s: float = 0.25
    #: Scale in only after this long below the low watermark: the default is
    #: Kubernetes HPA's downscale stabilization window (5 min). A short one
    #: (it was 10 s) scales in during a burst's quiet start and then lags
    #: load that doubles every 30 s (the simulator's bursty p99 went from
    #: 3 ms with instances kept to ~200 ms).
    scale_in_cooldown_s: float = 300.0
    #: Instances added at most in one decision; None: no bound (straight to
    #: the count the load needs).
    max_step_out: int | None = None
    #: A kind whose instances are this busy (CPU per instance) is saturated:
    #: what it reports is what it managed, not what was asked of it, so the
    #: load-sized step underestimates the flood. It then grows at least by
    #: ``saturated_growth`` per decision (slow-start doubling) until it is not.
    saturated_cpu: float = 0.9
    saturated_growth: float = 2.0
    #: A decided target not reached after this long no longer blocks the kind.
    action_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.low_watermark < self.target_utilization < self.high_watermark:
            raise ValueError(
                "need 0 < low_watermark < target_utilization < high_watermark, got "
                f"{self.low_watermark} / {self.target_utilization} / {self.high_watermark}"
            )
        if not 0 < self.saturated_cpu <= 1 or self.saturated_growth < 1:
            raise ValueError("need 0 < saturated_cpu <= 1 and saturated_growth >= 1")
        if self.max_step_out is not None and self.max_step_out < 1:
            raise ValueError("max_step_out must be >= 1 (or None: no bound)")
        if min(self.scale_out_cooldown_s, self.scale_in_cooldown_s, self.action_timeout_s) < 0:
            raise ValueError("cooldowns and timeouts must be >= 0")


@dataclass(frozen=True)
class KindLoad:
    """What the controller currently sees of one kind."""

    #: Ready instances (registered, warm, not draining).
    instances: int
    #: Summed ops/s of the kind's critical operation over its instances.
    load: float
    #: Summed queue depth reported by its instances (shown, not decided on).
    queue_depth: int = 0
    #: An action for this kind is still being carried out.
    busy: bool = False
    #: Summed busy cores of its instances (process CPU seconds per second),
    #: 0 when not reported. T prices one critical operation with the ones
    #: that usually come with it, which a changed mix breaks: in a flood of
    #: cold starts each Dispatch request also starts an instance, so
    #: Dispatch saturated while ops/T said 60% and was never scaled (the
    #: simulator's 5,000-node flood). CPU sees what T does not price.
    cpu: float = 0.0

    def utilization(self, capacity: float) -> float:
        """This load's utilization of its instances (``utilization``)."""
        return utilization(self.load, self.instances, capacity, self.cpu)


@dataclass(frozen=True)
class ScalingContext:
    """Input of one decision: the time (from the injected clock) and loads."""

    now: float
    kinds: Mapping[str, KindLoad]
    config: ScalingConfig


@dataclass(frozen=True)
class KindState:
    """What the policy remembers about one kind between ticks."""

    desired: int | None = None
    decided_at: float = _NEVER
    last_out_at: float = _NEVER
    last_in_at: float = _NEVER
    #: Since when utilization has been below the low watermark (None: it is not).
    low_since: float | None = None
    #: The kind has had a ready instance: from then on, none at all means
    #: they were lost (crashed, node gone) and are replaced, not awaited.
    seen: bool = False


@dataclass(frozen=True)
class ScalingState:
    """Policy state carried from one tick to the next."""

    kinds: Mapping[str, KindState] = field(default_factory=dict)

    def kind(self, name: str) -> KindState:
        """The state of one kind (a fresh one if never seen)."""
        return self.kinds.get(name, KindState())


@dataclass(frozen=True)
class Decision:
    """Scale ``kind`` from ``current`` to ``desired`` instances, and why.

    code is a short, fixed label (for metrics): lost (every instance of a
    kind that had some is gone), below_min, above_max, overload, underload.
    """

    kind: str
    current: int
    desired: int
    code: str
    reason: str
    load: float
    utilization: float

    @property
    def delta(self) -> int:
        """Instances to add (> 0) or remove (< 0)."""
        return self.desired - self.current


def utilization(load: float, instances: int, capacity: float, cpu: float = 0.0) -> float:
    """max(load / (instances * capacity), cpu / instances); infinite with
    load (or CPU) and no instance."""
    if instances <= 0:
        return math.inf if load > 0 or cpu > 0 else 0.0
    by_ops = load / (instances * capacity)
    by_cpu = cpu / instances
    return by_ops if by_ops >= by_cpu else by_cpu


def needed_instances(load: float, limits: KindLimits, target: float, cpu: float = 0.0) -> int:
    """Instances that carry load (and its CPU) at the target utilization,
    within bounds."""
    work = max(load / limits.capacity, cpu)
    raw = math.ceil(work / target - 1e-9) if work > 0 else 0
    return max(limits.min_instances, min(limits.max_instances, raw))


def _pending(ks: KindState, instances: int, now: float, cfg: ScalingConfig) -> bool:
    # A target this policy decided that the instances have not reached yet.
    return (
        ks.desired is not None
        and ks.desired != instances
        and now - ks.decided_at < cfg.action_timeout_s
    )


def _candidate(
    kind: str, kl: KindLoad, ks: KindState, now: float, cfg: ScalingConfig
) -> tuple[float, Decision] | None:
    """This kind's decision, if it wants one, with its urgency (higher first)."""
    lim = cfg.limits[kind]
    n, load = kl.instances, kl.load
    u = kl.utilization(lim.capacity)
    needed = needed_instances(load, lim, cfg.target_utilization, kl.cpu)
    op = LOAD_OPS.get(kind, "ops")
    if n == 0:
        if ks.seen:
            # Every instance is gone (their members expired): start the
            # minimum again, before anything else (nothing serves the kind).
            return 8.0, Decision(
                kind, 0, lim.min_instances, "lost",
                f"all instances lost; starting {lim.min_instances}", load, u,
            )  # fmt: skip
        # Not started yet: whatever deploys the control plane (galaxy up, a
        # Deployment) brings the first instance; the controller takes over
        # from there. Deciding now would race the bootstrap.
        return None
    if n < lim.min_instances:
        return 4.0, Decision(
            kind, n, lim.min_instances, "below_min",
            f"{n} instances < min {lim.min_instances}", load, u,
        )  # fmt: skip
    if n > lim.max_instances:
        return 2.0, Decision(
            kind, n, lim.max_instances, "above_max",
            f"{n} instances > max {lim.max_instances}", load, u,
        )  # fmt: skip
    if u > cfg.high_watermark and n < lim.max_instances:
        if now - ks.last_out_at < cfg.scale_out_cooldown_s:
            return None
        if kl.cpu >= cfg.saturated_cpu * n:
            needed = max(needed, math.ceil(n * cfg.saturated_growth))
        to = min(lim.max_instances, max(n + 1, needed))
        if cfg.max_step_out is not None:
            to = min(to, n + cfg.max_step_out)
        reason = (
            f"overload: {op} {load:.0f}/s and {kl.cpu:.2f} busy cores are {u:.0%} of "
            f"{n} x T={lim.capacity:.0f}/s (> {cfg.high_watermark:.0%}); need {needed}"
        )
        return 3.0 + min(u, 1e6) / 1e7, Decision(kind, n, to, "overload", reason, load, u)
    if (
        ks.low_since is not None
        and n > lim.min_instances
        and now - ks.low_since >= cfg.scale_in_cooldown_s
        and now - max(ks.last_out_at, ks.last_in_at) >= cfg.scale_in_cooldown_s
        # Hysteresis: one fewer instance must still run at or below target.
        and utilization(load, n - 1, lim.capacity, kl.cpu) <= cfg.target_utilization
    ):
        reason = (
            f"underload: {op} {load:.0f}/s is {u:.0%} of {n} x T={lim.capacity:.0f}/s "
            f"(< {cfg.low_watermark:.0%} for {now - ks.low_since:.0f}s)"
        )
        return 1.0 - u / 10, Decision(kind, n, n - 1, "underload", reason, load, u)
    return None


def decide_all(ctx: ScalingContext, state: ScalingState) -> tuple[list[Decision], ScalingState]:
    """Every decision of one tick: one per kind at most (``decide`` until
    it has none; a kind just decided is pending, so it is not decided twice).
    During a flood every kind that needs instances gets them in the same
    tick instead of one kind per tick."""
    out: list[Decision] = []
    for _ in range(len(ctx.kinds) + 1):
        d, state = decide(ctx, state)
        if d is None:
            break
        out.append(d)
    return out, state


def decide(ctx: ScalingContext, state: ScalingState) -> tuple[Decision | None, ScalingState]:
    """One tick of the policy: at most one decision, and the new state."""
    cfg, now = ctx.config, ctx.now
    kinds = dict(state.kinds)
    best: tuple[float, Decision] | None = None
    for kind in sorted(ctx.kinds):
        if kind not in cfg.limits:
            continue
        kl = ctx.kinds[kind]
        ks = state.kind(kind)
        u = kl.utilization(cfg.limits[kind].capacity)
        # The low-load clock runs whatever happens to other kinds this tick.
        low = u < cfg.low_watermark
        ks = replace(
            ks,
            low_since=(ks.low_since if ks.low_since is not None else now) if low else None,
            seen=ks.seen or kl.instances > 0,
        )
        if ks.desired is not None and not _pending(ks, kl.instances, now, cfg):
            ks = replace(ks, desired=None)  # reached (or given up on): forget it
        kinds[kind] = ks
        if kl.busy or _pending(ks, kl.instances, now, cfg):
            continue
        cand = _candidate(kind, kl, ks, now, cfg)
        if cand is not None and (best is None or cand[0] > best[0]):
            best = cand
    if best is None:
        return None, ScalingState(kinds)
    d = best[1]
    ks = kinds[d.kind]
    out = d.delta > 0
    kinds[d.kind] = replace(
        ks,
        desired=d.desired,
        decided_at=now,
        last_out_at=now if out else ks.last_out_at,
        last_in_at=ks.last_in_at if out else now,
        low_since=None,
    )
    return d, ScalingState(kinds)


def scale_in_victim(ready: Iterable[str], stoppable: Iterable[str]) -> str | None:
    """Which instance a scale-in removes: the first of ``stoppable`` (the
    ids the actuator can stop, its preferred victim first; the local
    actuator's order is newest started first) that is READY, so a warming,
    draining or standby instance is never picked. None: no such instance.
    The reconcile loop and the simulator's controller both ask here."""
    live = set(ready)
    return next((i for i in stoppable if i in live), None)
