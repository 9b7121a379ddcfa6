"""When to try again: jittered exponential backoff inside the caller's
deadline. A pure policy (no I/O, injected clock time and random source), so
the SDK and the gateway share it and tests drive it directly."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays before attempt 2, 3, ...: ``base_s * 2**n`` capped at
    ``cap_s``, with full jitter (a uniform draw below it, so clients that
    failed together do not retry together); no retry once ``max_attempts``
    were made or the next attempt could not start before the deadline."""

    base_s: float = 0.02
    cap_s: float = 0.5
    max_attempts: int = 100
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempts_made: int, now: float, deadline: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up."""
        if attempts_made >= self.max_attempts:
            return None
        ceiling = min(self.cap_s, self.base_s * (2 ** (attempts_made - 1)))
        d = self.rng.uniform(0, ceiling)
        # Leave the attempt itself some of the remaining time.
        if now + d >= deadline - min(0.05, (deadline - now) / 4):
            return None
        return d
