"""The heartbeat forwarding rule (pure; the servicer and the simulator both
use it)."""

from __future__ import annotations

import pytest

from functions.clustermgr.forwarding import HeartbeatForwarding
from functions.clustermgr.policy import Updated


def test_changes_go_at_once_unchanged_once_per_refresh_period() -> None:
    f = HeartbeatForwarding(heartbeat_s=1.0, refresh_beats=10)
    assert f.should_forward("n1", Updated.SAME, 0.0)  # never sent: send
    sent = [t for t in range(1, 25) if f.should_forward("n1", Updated.SAME, float(t))]
    assert sent == [10, 20]
    assert f.should_forward("n1", Updated.CHANGED, 21.0)
    assert f.should_forward("n1", Updated.REVIVED, 21.5)
    assert not f.should_forward("n1", Updated.SAME, 22.0)  # the change reset the clock


@pytest.mark.parametrize("outcome", [Updated.UNKNOWN, Updated.STALE])
def test_unknown_and_stale_beats_are_never_forwarded(outcome: Updated) -> None:
    assert not HeartbeatForwarding(1.0).should_forward("n1", outcome, 0.0)


def test_a_forgotten_node_is_sent_again() -> None:
    f = HeartbeatForwarding(1.0)
    assert f.should_forward("n1", Updated.SAME, 0.0)
    f.forget("n1")
    assert f.should_forward("n1", Updated.SAME, 1.0)
    with pytest.raises(ValueError):
        HeartbeatForwarding(0.0)
