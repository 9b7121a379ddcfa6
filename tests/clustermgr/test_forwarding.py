"""The heartbeat forwarding rule and how long each status may wait for
company (pure; the servicer and the simulator both use it)."""

from __future__ import annotations

import pytest

from functions.clustermgr.forwarding import (
    COVERED_BEATS,
    HeartbeatForwarding,
    Send,
    classify,
    covered,
)
from functions.clustermgr.policy import Updated
from galaxy.v1 import common_pb2


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


def _st(
    alloc: int = 0, starting: int = 0, *, cap: int = 4096, seq: int = 1, **kw: object
) -> common_pb2.NodeStatus:
    """A node status; allocation and capacity in MiB (and millicores)."""
    return common_pb2.NodeStatus(
        node_id="n1",
        address=str(kw.get("address", "10.0.0.1:1")),
        capacity=common_pb2.Resources(cpu_millis=cap, memory_mib=cap),
        allocated=common_pb2.Resources(cpu_millis=alloc, memory_mib=alloc),
        starting=common_pb2.Resources(cpu_millis=starting, memory_mib=starting),
        incarnation=int(kw.get("incarnation", 7)),  # type: ignore[call-overload]
        seq=seq,
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (_st(0), _st(256, 256)),  # a start (its allocation, still starting)
        (_st(256, 256), _st(256, 0)),  # it became ready
        (_st(256, 256), _st(512, 0)),  # ready, and another one placed and ready
    ],
)
def test_what_the_owner_placed_itself_may_wait(
    before: common_pb2.NodeStatus, after: common_pb2.NodeStatus
) -> None:
    assert classify(Updated.CHANGED, before, after) is Send.COVERED


@pytest.mark.parametrize(
    "after",
    [
        _st(0),  # the instance stopped: a free
        _st(256, 512),  # one stopped while another started: the growth hides a free
        _st(0, 0, cap=2048),  # capacity changed
        _st(256, 256, address="10.0.0.2:1"),  # moved
        _st(256, 256, incarnation=8),  # a new life of the agent
    ],
)
def test_news_goes_at_once(after: common_pb2.NodeStatus) -> None:
    before = _st(256, 256)
    assert classify(Updated.CHANGED, before, after) is Send.NOW
    assert not covered(before, after)


def test_a_model_cache_change_goes_at_once() -> None:
    before = _st(256)
    after = _st(256)
    after.models.add(digest="sha256:ab", tier="memory", size_bytes=1)
    assert classify(Updated.CHANGED, before, after) is Send.NOW


def test_outcomes_other_than_a_plain_change() -> None:
    st = _st(256)
    assert classify(Updated.SAME, st, st) is Send.REFRESH
    assert classify(Updated.REVIVED, _st(0), st) is Send.NOW  # back from the dead
    assert classify(Updated.CHANGED, None, st) is Send.NOW  # nothing to compare with


def test_how_long_each_kind_may_wait() -> None:
    f = HeartbeatForwarding(heartbeat_s=1.0)
    assert f.wait_s(Updated.CHANGED, _st(0), _st(256, 256), 0.0) == COVERED_BEATS * 1.0
    assert f.wait_s(Updated.CHANGED, _st(256), _st(0), 0.5) == 0.0
    assert f.wait_s(Updated.SAME, _st(0), _st(0), 1.0) is None  # a refresh is not due
    assert f.wait_s(Updated.SAME, _st(0), _st(0), 20.0) == 1.0
    assert f.wait_s(Updated.STALE, _st(0), _st(0), 30.0) is None
    g = HeartbeatForwarding(1.0, covered_linger_s=0.0, refresh_linger_s=3.0)
    assert g.wait_s(Updated.CHANGED, _st(0), _st(256, 256), 0.0) == 0.0
    assert g.wait_s(Updated.SAME, _st(256), _st(256), 20.0) == 3.0
    with pytest.raises(ValueError):
        HeartbeatForwarding(1.0, covered_linger_s=-1.0)
