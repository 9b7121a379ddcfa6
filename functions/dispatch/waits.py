"""How long a request may wait for a slot: one rule for the Dispatch
servicer and the simulator's Galaxy model. Pure, no I/O."""

from __future__ import annotations

# When the caller set no deadline, a queued request waits at most this long.
MAX_WAIT_S = 60.0
# Time kept back from the caller's deadline to send a clear answer in time.
DEADLINE_MARGIN_S = 0.05


def wait_timeout_s(remaining_s: float | None, request_timeout_s: float) -> float:
    """The wait of a request with ``remaining_s`` left of its caller's
    deadline (None: no deadline) on a function whose request timeout is
    ``request_timeout_s``; past it the request is refused (DEADLINE_EXCEEDED)."""
    t = MAX_WAIT_S if remaining_s is None else max(0.0, remaining_s - DEADLINE_MARGIN_S)
    return min(t, request_timeout_s)
