"""Adaptive batching policy (KServe's batcher idea, adaptive): when the
gateway sends the requests gathered for one function as one call. Pure: no
I/O, the clock is passed in; the gateway performs the decisions
(``controlplane/gateway/batcher.py``).

The rule, per function:

- a batch that holds ``max_batch_size`` rows goes at once;
- while fewer than ``parallel`` batches are in flight (the function has an
  idle slot), what is gathered goes at once: a lone request waits for
  nothing, so at low load batching adds no latency;
- while every slot is busy, requests gather; the batch goes when a batch in
  flight returns (a slot freed), or when its first request has waited
  ``max_latency_ms``, whichever comes first. So the wait shrinks to zero
  when the function is idle and grows toward ``max_latency_ms`` under load,
  and batches grow with the load.

At most ``max_queue`` requests wait: more are refused (the caller answers
503 with Retry-After), so a function that stopped answering holds a bounded
amount of memory in the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """What to do now: send the first ``send`` requests (0: none), and wake
    up at ``wake_at`` (None: no timer needed) to ask again."""

    send: int = 0
    wake_at: float | None = None


class BatchPolicy:
    """The batching state of one function (one batch key)."""

    def __init__(
        self, max_batch_size: int, max_latency_s: float, parallel: int, max_queue: int
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s
        self.parallel = parallel
        self.max_queue = max_queue
        #: rows of each waiting request, oldest first
        self.rows: list[int] = []
        #: arrival time of each waiting request
        self.arrived: list[float] = []
        self.in_flight = 0

    def admit(self, rows: int, now: float) -> bool:
        """Queue a request of ``rows`` rows; False when the queue is full."""
        if len(self.rows) >= self.max_queue:
            return False
        self.rows.append(rows)
        self.arrived.append(now)
        return True

    def decide(self, now: float) -> Decision:
        """What to do after any event (an arrival, a return, a timer)."""
        if not self.rows:
            return Decision()
        n = self._take()
        full = sum(self.rows[:n]) >= self.max_batch_size or n < len(self.rows)
        idle = self.in_flight < self.parallel
        due = self.arrived[0] + self.max_latency_s
        if full or idle or now >= due:
            return Decision(send=n)
        return Decision(wake_at=due)

    def sent(self, n: int) -> None:
        """The first n waiting requests left as one batch."""
        del self.rows[:n], self.arrived[:n]
        self.in_flight += 1

    def returned(self) -> None:
        """A batch in flight answered (or failed)."""
        self.in_flight -= 1

    def _take(self) -> int:
        """How many waiting requests the next batch takes: as many as fit in
        max_batch_size rows, and at least one (a request larger than the
        limit goes alone, never split)."""
        total = 0
        for i, r in enumerate(self.rows):
            if total + r > self.max_batch_size:
                return max(i, 1)
            total += r
        return len(self.rows)
