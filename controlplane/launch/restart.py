"""When `galaxy up` restarts a child that died: exponential backoff with a
restart budget. Pure: the supervisor passes the times in.

A child that dies is started again after ``base_s``, doubling per quick
death up to ``cap_s``; one that stayed up for ``healthy_s`` starts from
``base_s`` again. More than ``budget`` restarts of one child within
``window_s`` means it cannot run here (a crash loop): the policy answers
None, and the supervisor stops the run saying why.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    """Backoff and budget per child name."""

    base_s: float = 0.2
    cap_s: float = 10.0
    healthy_s: float = 30.0
    budget: int = 5
    window_s: float = 60.0
    _restarts: dict[str, deque[float]] = field(default_factory=dict)
    _delay: dict[str, float] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        """The child (re)started at ``now``."""
        self._started[name] = now

    def on_exit(self, name: str, now: float) -> float | None:
        """Seconds to wait before starting ``name`` again, or None when its
        restart budget is spent."""
        recent = self._restarts.setdefault(name, deque())
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        if len(recent) >= self.budget:
            return None
        up_for = now - self._started.get(name, now)
        delay = self.base_s if up_for >= self.healthy_s else self._delay.get(name, 0.0) * 2
        delay = min(self.cap_s, max(self.base_s, delay))
        self._delay[name] = delay
        recent.append(now)
        return delay

    def restarts(self, name: str) -> int:
        """Restarts of ``name`` within the window."""
        return len(self._restarts.get(name, ()))
