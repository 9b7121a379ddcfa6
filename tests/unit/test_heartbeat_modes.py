"""The pure parts of batched heartbeats: how an agent sends to each
ClusterMgr address (HeartbeatModes, with the time passed in), how far
ahead a round reaches, and what ClusterMgr refuses in a batch."""

from __future__ import annotations

import pytest

from controlplane.nodeagent.heartbeat_modes import (
    MAX_BATCH,
    ROUND_WINDOW_S,
    HeartbeatModes,
    Mode,
    round_window_s,
)
from functions.clustermgr import heartbeats
from galaxy.v1 import clustermgr_pb2, common_pb2


def test_the_switches_choose_the_best_way() -> None:
    assert HeartbeatModes(batches=True, streams=True, retry_s=60).mode("a", 0) is Mode.BATCHES
    assert HeartbeatModes(batches=False, streams=True, retry_s=60).mode("a", 0) is Mode.STREAM
    # No cached channel: no stream of either kind.
    assert HeartbeatModes(batches=True, streams=False, retry_s=60).mode("a", 0) is Mode.UNARY


def test_unimplemented_steps_down_one_way_at_a_time_per_address() -> None:
    m = HeartbeatModes(batches=True, streams=True, retry_s=60)
    assert m.unimplemented("old", Mode.BATCHES, now=10) is Mode.STREAM
    assert m.mode("old", 11) is Mode.STREAM
    assert m.mode("new", 11) is Mode.BATCHES  # other addresses unaffected
    assert m.unimplemented("old", Mode.STREAM, now=12) is Mode.UNARY
    assert m.mode("old", 71.9) is Mode.UNARY
    # retry_s after the last step down, the best way is tried again.
    assert m.mode("old", 72) is Mode.BATCHES
    assert m.unimplemented("x", Mode.UNARY, now=0) is Mode.UNARY


def test_a_late_answer_of_a_better_way_does_not_undo_a_step_down() -> None:
    """Statuses in flight on the batch stream fail UNIMPLEMENTED after the
    agent already stepped down to unary: it stays there."""
    m = HeartbeatModes(batches=True, streams=True, retry_s=60)
    m.unimplemented("old", Mode.BATCHES, now=0)
    m.unimplemented("old", Mode.STREAM, now=0)
    assert m.unimplemented("old", Mode.BATCHES, now=1) is Mode.UNARY


def test_without_batches_a_step_down_never_goes_back_up_to_them() -> None:
    m = HeartbeatModes(batches=False, streams=True, retry_s=5)
    assert m.unimplemented("old", Mode.STREAM, now=0) is Mode.UNARY
    assert m.mode("old", 5) is Mode.STREAM


def test_the_round_window_is_a_quarter_interval_only_with_batches() -> None:
    assert round_window_s(1.0, batches=True) == pytest.approx(0.25)
    assert round_window_s(1.0, batches=False) == ROUND_WINDOW_S
    # A short interval never shrinks it below the window without batches.
    assert round_window_s(0.02, batches=True) == ROUND_WINDOW_S


def _batch(*node_ids: str) -> clustermgr_pb2.NodeStatusBatch:
    return clustermgr_pb2.NodeStatusBatch(
        statuses=[common_pb2.NodeStatus(node_id=n, seq=1) for n in node_ids]
    )


def test_check_batch_names_the_field_and_index_never_the_value() -> None:
    assert heartbeats.check_batch(_batch("a", "b")) is None
    assert heartbeats.check_batch(_batch(*(f"n{i}" for i in range(MAX_BATCH)))) is None
    assert heartbeats.MAX_BATCH == MAX_BATCH  # agent and server agree
    assert heartbeats.check_batch(_batch()) == "statuses: a batch holds at least one status"
    too_many = heartbeats.check_batch(_batch(*(f"n{i}" for i in range(MAX_BATCH + 1))))
    assert too_many == f"statuses: {MAX_BATCH + 1} statuses, at most {MAX_BATCH} per batch"
    assert heartbeats.check_batch(_batch("a", "")) == "statuses[1].node_id: must be set"
    dup = heartbeats.check_batch(_batch("secret-a", "b", "secret-a"))
    assert dup == "statuses[2].node_id: the same node as statuses[0]"
