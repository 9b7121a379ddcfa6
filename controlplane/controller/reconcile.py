"""The controller's reconcile loop: load reports in, scale actions out.

Every tick (default 1 s) the leader expires silent members, aggregates the
load reports per kind, runs the pure policy (``scaling.decide``) and carries
out its decision, if any, as a background action:

* scale-out: commit the target (fenced, see ``leader.ScaleLedger``), start
  the instances through the actuator, wait until they have registered and
  warmed (``Coordinator.warm``) and Dispatch has been told: then they take
  traffic;
* scale-in: pick a victim the actuator can stop, mark it DRAINING and push
  the membership (no one routes to it any more), wait until it reports an
  empty queue after a grace period (or a drain timeout), then stop it and
  deregister it. No request is dropped because an instance was removed.

While an action runs its kind is busy, so a burst yields one decision, not
one per tick.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from controlplane.controller import scalemetrics as sm
from controlplane.controller.actions import (
    ActionId,
    ActionRecord,
    AppliedActions,
    Changes,
    Timeouts,
)
from controlplane.controller.actuators.base import Actuator, ActuatorError
from controlplane.controller.coordinator import Coordinator
from controlplane.controller.leader import Fenced, ScaleLedger
from controlplane.controller.registry import ControlRegistry, State
from controlplane.controller.scaling import (
    KINDS,
    LOAD_OPS,
    Decision,
    KindLoad,
    KindState,
    ScalingConfig,
    ScalingContext,
    ScalingState,
    decide,
    scale_in_victim,
)
from controlplane.runtime import rpc
from controlplane.runtime.clock import Clock
from controlplane.runtime.loadreport import busy_cores
from controlplane.runtime.membership import KIND_BY_NAME
from galaxy.v1 import controller_pb2
from statestore import StoreError

log = logging.getLogger(__name__)


class Reconciler:
    """Runs the scaling policy and applies its decisions; see module docstring.

    is_leader / term: leadership (always leader without election). ledger:
    fenced commits of targets (high-availability mode). enabled=False only
    observes: load and status are kept, nothing is decided.
    """

    def __init__(
        self,
        registry: ControlRegistry,
        coordinator: Coordinator,
        actuator: Actuator,
        config: ScalingConfig,
        changes: Changes,
        *,
        enabled: bool = True,
        clock: Clock | None = None,
        ledger: ScaleLedger | None = None,
        leader_id: str = "",
        is_leader: Callable[[], bool] = lambda: True,
        term: Callable[[], int] = lambda: 0,
        tick_s: float = 1.0,
        timeouts: Timeouts | None = None,
        history: int = 20,
    ) -> None:
        self.registry = registry
        self.coordinator = coordinator
        self.actuator = actuator
        self.config = config
        self.changes = changes
        self.enabled = enabled
        self.clock = clock or registry.clock
        self.ledger = ledger
        self.leader_id = leader_id
        self.is_leader = is_leader
        self.term = term
        self.tick_s = tick_s
        self.timeouts = timeouts or Timeouts()
        self.state = ScalingState()
        self.history: collections.deque[ActionRecord] = collections.deque(maxlen=history)
        self._busy: dict[str, asyncio.Task[None]] = {}
        self._overload_since: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        #: Actions applied (or adopted from the previous leader), so that
        #: none is applied twice; ids count decisions within a term.
        self.applied = AppliedActions()
        self._seq = 0

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start ticking."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="reconcile")

    async def stop(self) -> None:
        """Stop ticking and cancel actions in progress."""
        tasks = [*self._busy.values(), *([self._task] if self._task else [])]
        self._task = None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def adopt(self) -> None:
        """This controller was just elected: fence the previous leader off
        and, for an actuator whose instances outlive controllers, continue
        from the targets it committed."""
        if self.ledger is None:
            return
        targets = await self.ledger.adopt(self.term(), self.leader_id)
        log.info("adopted scale targets %s (term %d)", targets, self.term())
        for kind, text in self.ledger.adopted.items():
            # The predecessor's actions are its own: never applied again
            # here (an external platform's target is made real below by an
            # absolute count, which is idempotent).
            if (aid := ActionId.parse(text)) is not None:
                self.applied.adopt(kind, aid)
        if not self.actuator.external or not targets:
            return
        now = self.clock.now()
        # The committed targets are the previous leader's last actions: they
        # count as recent (cooldown), and they are made real if that leader
        # died before its actuator call (idempotent: an absolute count).
        self.state = ScalingState(
            {
                k: replace(self.state.kind(k), desired=v, decided_at=now, last_out_at=now)
                for k, v in targets.items()
            }
        )
        for kind, desired in targets.items():
            try:
                await self.actuator.ensure(kind, desired)
            except ActuatorError as e:
                log.warning("cannot make %s target %d real: %s", kind, desired, e)

    def deposed(self) -> None:
        """Leadership lost: abandon actions in progress (the next leader
        finishes from the committed targets)."""
        for t in self._busy.values():
            t.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)  # the policy runs on a fixed tick
            sm.LEADER.set(1 if self.is_leader() else 0)
            if not self.is_leader():
                continue
            try:
                # Every kind that needs a decision gets it this round (a kind
                # being scaled is busy, so it is not decided twice).
                for _ in KINDS:
                    if await self.tick() is None:
                        break
            except Exception:  # one bad tick must not end scaling
                log.exception("reconcile tick failed")

    # -- one tick -----------------------------------------------------------

    def kind_load(self, kind: str, now: float) -> KindLoad:
        """What the policy sees of one kind now."""
        op = LOAD_OPS[kind]
        fresh_s = self.timeouts.report_fresh_s
        load, queue, ready, unsettled, cpu = 0.0, 0, 0, False, 0.0
        for m in self.registry.members(KIND_BY_NAME[kind]):
            if m.state is State.STANDBY:
                continue  # idle by design: neither load nor capacity
            ready += m.state is State.READY
            if m.last_report_at is not None and now - m.last_report_at <= fresh_s:
                load += m.ops_per_second.get(op, 0.0)
                queue += m.queue_depth
                cpu += busy_cores(m.ops_per_second)
            # A ready instance that has not reported since it became ready
            # (just added, or restored by a new leader): its share of the
            # load is unknown, and deciding now would act on the old picture.
            # Bounded, so a member that never reports cannot block scaling.
            unsettled |= (
                m.state is State.READY
                and (m.last_report_at is None or m.last_report_at < m.ready_since)
                and now - m.ready_since < fresh_s
            )
        return KindLoad(ready, load, queue, busy=kind in self._busy or unsettled, cpu=cpu)

    async def tick(self) -> Decision | None:
        """Expire silent members, decide, and start carrying the decision out."""
        await self._expire_dead()
        now = self.clock.now()
        loads = {k: self.kind_load(k, now) for k in KINDS if k in self.config.limits}
        for k, kl in loads.items():
            u = kl.utilization(self.config.limits[k].capacity)
            if u > self.config.high_watermark:
                self._overload_since.setdefault(k, now)
            else:
                self._overload_since.pop(k, None)
        self._gauges(loads)
        if not self.enabled:
            return None
        before = self.state
        d, self.state = decide(ScalingContext(now, loads, self.config), self.state)
        if d is None:
            return None
        self._seq += 1
        aid = ActionId(self.term(), self._seq)
        rec = ActionRecord(d, time.time(), self.term(), action=str(aid))
        if d.code == "overload":
            rec.detect_s = now - self._overload_since.get(d.kind, now)
        self.history.appendleft(rec)
        log.info("scale %s %d -> %d: %s", d.kind, d.current, d.desired, d.reason)
        log.debug(
            "loads: %s",
            {m.info.id: m.ops_per_second for m in self.registry.members(KIND_BY_NAME[d.kind])},
        )
        if self.ledger is not None:
            try:
                await self.ledger.commit(
                    d.kind, d.desired, code=d.code, reason=d.reason, leader_id=self.leader_id,
                    action=rec.action,
                )  # fmt: skip
            except (Fenced, StoreError) as e:
                rec.outcome = "fenced" if isinstance(e, Fenced) else f"failed: state store: {e}"
                log.warning("scale %s not applied: %s", d.kind, e)
                self.state = before
                return d
        sm.ACTIONS.labels(d.kind, "out" if d.delta > 0 else "in", d.code).inc()
        self._busy[d.kind] = asyncio.create_task(self._apply(rec), name=f"scale-{d.kind}")
        return d

    async def _expire_dead(self) -> None:
        """Remove members that stopped reporting and do not answer a health
        check either. A member that is only slow to report (an overloaded
        machine) keeps its place: removing it would repartition for nothing."""
        silent = self.registry.silent(
            self.timeouts.member_silent_s, self.timeouts.member_unconfirmed_s
        )
        if not silent:
            return
        pool = self.coordinator.pool
        answers = await asyncio.gather(*(rpc.serving(pool, m.info.address) for m in silent))
        for m, ok in zip(silent, answers, strict=True):
            cur = self.registry.get(m.info.kind, m.info.id)
            if ok or cur is None or cur.info.address != m.info.address:
                continue
            log.warning("%s %s stopped reporting and answering: removed", m.info.kind, m.info.id)
            if self.registry.deregister(m.info.kind, m.info.id):
                self.coordinator.mark_dirty()

    async def wait_idle(self) -> None:
        """Wait until no action is in progress (tests, shutdown)."""
        while self._busy:
            await asyncio.gather(*self._busy.values(), return_exceptions=True)

    # -- actions ------------------------------------------------------------

    async def _may_apply(self, rec: ActionRecord) -> str:
        """Why rec must not be applied ("" = it may): this controller no
        longer leads, a newer leader has rewritten the target since it was
        committed, or the action (or a newer one) was applied already."""
        kind = rec.decision.kind
        if not self.is_leader():
            return "not the leader any more"
        if self.ledger is not None and not await self.ledger.still_mine(kind):
            return "fenced: another controller has taken the target over"
        aid = ActionId.parse(rec.action)
        if aid is None or not self.applied.admit(kind, aid):
            return f"already applied (newest applied: {self.applied.last(kind)})"
        return ""

    async def _apply(self, rec: ActionRecord) -> None:
        d = rec.decision
        start = self.clock.now()
        try:
            why_not = await self._may_apply(rec)
            if why_not:
                raise ActuatorError(f"not applied: {why_not}")
            if d.delta > 0:
                await self._scale_out(d, rec)
                sm.SCALE_OUT_SECONDS.labels(d.kind).observe(self.clock.now() - start)
            else:
                await self._scale_in(d, rec)
            rec.outcome = "done"
        except (ActuatorError, TimeoutError, StoreError) as e:
            rec.outcome = f"failed: {e}"
            log.warning("scale %s %d -> %d failed: %s", d.kind, d.current, d.desired, e)
            # Let the policy decide afresh instead of waiting for the target.
            ks = self.state.kind(d.kind)
            self.state = ScalingState({**self.state.kinds, d.kind: replace(ks, desired=None)})
        except asyncio.CancelledError:
            rec.outcome = "abandoned (leadership lost or shutdown)"
            raise
        finally:
            rec.duration_s = self.clock.now() - start
            self._busy.pop(d.kind, None)

    async def _scale_out(self, d: Decision, rec: ActionRecord) -> None:
        kid = KIND_BY_NAME[d.kind]
        # Warm standbys first: promoting one is a membership change, with
        # no process to start. The actuator starts the rest and replaces
        # the promoted standbys in the background.
        promoted = self.registry.promote(kid, d.delta)
        for m in promoted:
            log.info("promoted standby %s %s", d.kind, m.info.id)
            if m.state is State.WARMING:
                self.coordinator.spawn(self.coordinator.warm(m))
        if promoted:
            sm.STANDBY_PROMOTED.labels(d.kind).inc(len(promoted))
            self.coordinator.mark_dirty()
            self.coordinator.spawn(self._refill(d.kind, len(promoted)))
        ids = [m.info.id for m in promoted]
        if d.desired - d.current > len(promoted):
            ids += await self.actuator.scale_out(d.kind, d.current + len(promoted), d.desired)
        rec.instance_ids = list(ids)

        def taking_traffic() -> bool:
            if ids:
                ms = [self.registry.get(kid, i) for i in ids]
                return all(m is not None and m.state is State.READY for m in ms)
            return len(self.registry.members(kid, State.READY)) >= d.desired

        if not await self.changes.wait_for(taking_traffic, self.timeouts.register_s):
            raise TimeoutError(
                f"new {d.kind} instances not registered and warm within "
                f"{self.timeouts.register_s:.0f}s"
            )
        await self.coordinator.sync()  # Dispatch knows them: they take traffic

    async def _refill(self, kind: str, n: int) -> None:
        try:
            await self.actuator.add_standby(kind, n)
        except ActuatorError as e:
            log.warning("cannot replace %d promoted %s standby: %s", n, kind, e)

    async def _scale_in(self, d: Decision, rec: ActionRecord) -> None:
        kid = KIND_BY_NAME[d.kind]
        ready = [m.info.id for m in self.registry.members(kid, State.READY)]
        victim = scale_in_victim(ready, self.actuator.removable(d.kind, ready))
        if victim is None:
            raise ActuatorError(
                f"no {d.kind} instance that the {self.actuator.name} actuator can stop"
            )
        rec.instance_ids = [victim]
        self.registry.set_state(kid, victim, State.DRAINING)
        await self.coordinator.sync()  # from now on nobody routes to it
        since = self.clock.now()
        grace = self.timeouts.drain_grace_s

        def drained() -> bool:
            m = self.registry.get(kid, victim)
            if m is None:
                return True
            # A report taken after the grace period: requests sent before the
            # push was acknowledged have arrived by then.
            fresh = m.last_report_at is not None and m.last_report_at >= since + grace
            return fresh and m.queue_depth == 0

        if not await self.changes.wait_for(drained, self.timeouts.drain_s):
            log.warning(
                "%s %s not drained in %.0fs; stopping it", d.kind, victim, self.timeouts.drain_s
            )
        await self.actuator.scale_in(d.kind, victim, d.desired)
        if self.registry.deregister(kid, victim):
            self.coordinator.mark_dirty()

    # -- status -------------------------------------------------------------

    def _gauges(self, loads: dict[str, KindLoad]) -> None:
        for kind, kl in loads.items():
            lim = self.config.limits[kind]
            kid = KIND_BY_NAME[kind]
            for st in State:
                sm.INSTANCES.labels(kind, st.value).set(len(self.registry.members(kid, st)))
            sm.DESIRED.labels(kind).set(self.desired(kind, kl.instances))
            sm.LOAD.labels(kind).set(kl.load)
            sm.CAPACITY.labels(kind).set(lim.capacity)
            sm.UTILIZATION.labels(kind).set(min(kl.utilization(lim.capacity), 1e9))
            sm.QUEUE.labels(kind).set(kl.queue_depth)

    def desired(self, kind: str, ready: int) -> int:
        """The target of a kind (the ready count when nothing is pending)."""
        ks: KindState = self.state.kind(kind)
        return ks.desired if ks.desired is not None else ready

    def status(self) -> list[controller_pb2.ControlScaling]:
        """Per-kind scaling status for `galaxy status`."""
        now = self.clock.now()
        out = []
        for kind in KINDS:
            lim = self.config.limits.get(kind)
            if lim is None:
                continue
            kid = KIND_BY_NAME[kind]
            kl = self.kind_load(kind, now)
            out.append(
                controller_pb2.ControlScaling(
                    kind=kid,  # type: ignore[arg-type]
                    instances=kl.instances,
                    warming=len(self.registry.members(kid, State.WARMING)),
                    draining=len(self.registry.members(kid, State.DRAINING)),
                    desired=self.desired(kind, kl.instances),
                    load_op=LOAD_OPS[kind],
                    load=kl.load,
                    capacity=lim.capacity,
                    utilization=min(kl.utilization(lim.capacity), 1e9),
                    queue_depth=kl.queue_depth,
                    min_instances=lim.min_instances,
                    max_instances=lim.max_instances,
                    decisions=[r.to_proto() for r in self.history if r.decision.kind == kind],
                )
            )
        return out
