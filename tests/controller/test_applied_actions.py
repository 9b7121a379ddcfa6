"""No scale action is applied twice: the pure guard (``AppliedActions``)
and the reconciler that consults it before every actuator call."""

from __future__ import annotations

import time
from collections.abc import Sequence

from controlplane.controller.actions import (
    ActionId,
    ActionRecord,
    AppliedActions,
    Changes,
    Timeouts,
)
from controlplane.controller.actuators.base import Actuator
from controlplane.controller.coordinator import Coordinator
from controlplane.controller.reconcile import Reconciler
from controlplane.controller.registry import ControlRegistry
from controlplane.controller.scaling import Decision, KindLimits, ScalingConfig
from controlplane.runtime import rpc


def test_an_action_is_admitted_once() -> None:
    g = AppliedActions()
    assert g.last("dispatch") is None
    assert g.admit("dispatch", ActionId(3, 1))
    assert not g.admit("dispatch", ActionId(3, 1))  # the same decision again
    assert g.admit("schedule", ActionId(3, 1))  # kinds are independent
    assert g.last("dispatch") == ActionId(3, 1)


def test_a_deposed_leaders_older_action_is_refused() -> None:
    g = AppliedActions()
    assert g.admit("dispatch", ActionId(7, 1))  # the new leader (term 7) acted
    assert not g.admit("dispatch", ActionId(5, 9))  # term 5's action, late
    assert g.admit("dispatch", ActionId(7, 2))
    assert g.admit("dispatch", ActionId(8, 1))  # a later term counts from 1


def test_an_adopted_action_is_never_applied_again() -> None:
    g = AppliedActions()
    g.adopt("dispatch", ActionId(4, 2))  # the predecessor's committed action
    assert not g.admit("dispatch", ActionId(4, 2))
    assert not g.admit("dispatch", ActionId(4, 1))
    g.adopt("dispatch", ActionId(2, 1))  # older than known: no step back
    assert g.last("dispatch") == ActionId(4, 2)
    assert g.admit("dispatch", ActionId(5, 1))


def test_action_ids_round_trip_as_text() -> None:
    assert str(ActionId(12, 3)) == "12-3"
    assert ActionId.parse("12-3") == ActionId(12, 3)
    assert ActionId(2, 9) < ActionId(10, 1)  # by term first, numerically
    for bad in ("", "12", "a-1", "1-", "-1-2"):
        assert ActionId.parse(bad) is None


class CountingActuator(Actuator):
    name = "counting"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    async def scale_out(self, kind: str, current: int, desired: int) -> list[str]:
        self.calls.append((kind, current, desired))
        return [f"{kind}-new-{len(self.calls)}"]

    def removable(self, kind: str, registered: Sequence[str]) -> list[str]:
        return []

    async def scale_in(self, kind: str, instance_id: str, desired: int) -> None:
        raise AssertionError("not in this test")


async def test_the_reconciler_applies_one_decision_once() -> None:
    registry = ControlRegistry()
    pool = rpc.ChannelPool()
    act = CountingActuator()
    leading = [True]
    r = Reconciler(
        registry,
        Coordinator(registry, pool),
        act,
        ScalingConfig(limits={"dispatch": KindLimits(100.0)}),
        Changes(),
        is_leader=lambda: leading[0],
        term=lambda: 3,
        # The new instance never registers here: the action ends at once.
        timeouts=Timeouts(register_s=0.0),
    )
    try:
        d = Decision("dispatch", 1, 2, "overload", "test", 200.0, 2.0)
        rec = ActionRecord(d, time.time(), 3, action=str(ActionId(3, 1)))
        await r._apply(rec)
        assert act.calls == [("dispatch", 1, 2)]
        again = ActionRecord(d, time.time(), 3, action=rec.action)
        await r._apply(again)  # e.g. a retried task, or a re-elected leader
        assert act.calls == [("dispatch", 1, 2)]
        assert again.outcome.startswith("failed: not applied: already applied")
        # A controller that no longer leads applies nothing, new ids included.
        leading[0] = False
        late = ActionRecord(d, time.time(), 3, action=str(ActionId(3, 2)))
        await r._apply(late)
        assert act.calls == [("dispatch", 1, 2)] and "not the leader" in late.outcome
    finally:
        await r.stop()
        await pool.close()
