"""How a node agent sends heartbeats to each ClusterMgr instance (pure: no
I/O, the time is passed in).

Three ways, best first: batches on ``ClusterMgr.HeartbeatBatches`` (one
message carries the statuses of all of the agent's nodes due in the same
round), statuses one per message on ``ClusterMgr.Heartbeats``, and a unary
``Update`` each. The switches (``RpcConfig.heartbeat_batches``, the
connection cache) say which are allowed; a ClusterMgr that answers a
method UNIMPLEMENTED (an older version) gets the next way for a while, then
the best is tried again (it may have been upgraded).

Batching only pays when several nodes are due together, so with batches
the Registrar sends every node due within a quarter of the heartbeat
interval in one round (``round_window_s``): the pool's heartbeats gather
into a few rounds per interval instead of one round per node. A node then
beats up to that much early, never late.
"""

from __future__ import annotations

import enum

#: Heartbeats due within this window are sent in one round when batches are
#: off: fewer wakeups for a big pool, at the cost of a node beating up to
#: 10 ms early.
ROUND_WINDOW_S = 0.010
#: With batches, the window as a fraction of the heartbeat interval.
BATCH_WINDOW_FRACTION = 0.25
#: Most statuses the agent puts in one batch (the server's limit,
#: functions.clustermgr.heartbeats.MAX_BATCH).
MAX_BATCH = 256


class Mode(enum.IntEnum):
    """A way to send heartbeats, best first."""

    BATCHES = 0
    STREAM = 1
    UNARY = 2


def round_window_s(interval_s: float, batches: bool) -> float:
    """How far ahead of its due time a node's heartbeat may go in a round."""
    if batches:
        return max(ROUND_WINDOW_S, interval_s * BATCH_WINDOW_FRACTION)
    return ROUND_WINDOW_S


class HeartbeatModes:
    """The way to send heartbeats to each ClusterMgr address.

    batches, streams: whether HeartbeatBatches and Heartbeats may be used at
    all (streams off implies batches off: both need a cached channel).
    retry_s: how long a method answered UNIMPLEMENTED is not tried again at
    that address.
    """

    def __init__(self, *, batches: bool, streams: bool, retry_s: float) -> None:
        if not streams:
            self.best = Mode.UNARY
        else:
            self.best = Mode.BATCHES if batches else Mode.STREAM
        self.retry_s = retry_s
        # address -> (the best mode it is known to serve, until when)
        self._down: dict[str, tuple[Mode, float]] = {}

    def mode(self, address: str, now: float) -> Mode:
        """The way to send to address at time now."""
        down = self._down.get(address)
        if down is None:
            return self.best
        mode, until = down
        if now >= until:
            del self._down[address]
            return self.best
        return max(mode, self.best)

    def unimplemented(self, address: str, mode: Mode, now: float) -> Mode:
        """address answered mode UNIMPLEMENTED at time now: the next way is
        used there until now + retry_s. Returns the way to use now."""
        if mode is Mode.UNARY:
            return Mode.UNARY  # nothing below it; the caller reports the error
        nxt = Mode(mode + 1)
        held = self._down.get(address)
        if held is None or held[0] <= nxt:
            self._down[address] = (nxt, now + self.retry_s)
        return self.mode(address, now)
