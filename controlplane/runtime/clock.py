"""Injected clocks: policies take a Clock so tests and the simulator can drive time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time source in seconds."""

    def now(self) -> float:
        """Current time in seconds (monotonic, arbitrary origin)."""
        ...


class MonotonicClock:
    """Wall-independent real time (time.monotonic)."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; for tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError("a clock cannot go backward")
        self._t += seconds

    def set(self, t: float) -> None:
        """Jump to time t (must not be earlier than now)."""
        if t < self._t:
            raise ValueError("a clock cannot go backward")
        self._t = t
