"""How much of a slot a waiting request needs, counted for instance starts.

``FunctionRouter.scale_ups_needed`` starts instances for the waiting
requests that the free slots and the starts under way do not cover. Counting
each waiting request as a whole slot is right when a request holds its slot
for longer than a start takes; for short requests it is not: behind a slow
cold start (a restarted node agent, a loaded machine) the queue of a
10 requests/s function with 5 ms requests grows by 10 a second, each
``concurrency`` of them asked for another start, and the first instance to
come up would have served the whole queue in milliseconds. Every function
with waiters reached max_scale at once; those starts, all on one node, were
slower together than the startup timeout and were all made again
(2026-11-29, `galaxy chaos --fault agent --sandbox process` beside four busy
loops: 13 starts on one node, none ready within 10 s).

``StartPace`` keeps what the function's requests and starts took lately
(pure: the router passes the times, read from its injected clock). A slot
serves ``start_s / service_s`` requests in the time one start takes, so the
slots that ``waiting`` requests need before a new start could be ready are
``ceil(waiting * service_s / start_s)`` (never more than ``waiting``; all of
them while either time is unknown: no history, no discount). The request
path and the autoscaler both count waiting requests that way
(``FunctionRouter.demand``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: Weight of the newest sample in the moving averages: about the last five
#: starts or requests (a start's time changes with the node's load).
WEIGHT = 0.2
#: Starts whose begin times are kept (more are under way only past max_scale's
#: own bound; the oldest are then dropped, which only shortens a sample).
BEGUN_MAX = 1024


def _avg(old: float, sample: float) -> float:
    return sample if old <= 0.0 else old + (sample - old) * WEIGHT


@dataclass(slots=True)
class StartPace:
    """Moving averages of a function's request (slot hold) and start times."""

    #: seconds a slot is held per lease (0: none seen yet)
    service_s: float = 0.0
    #: seconds from a start's begin to its instance being routable (0: none yet)
    start_s: float = 0.0
    #: begin times of the starts under way, oldest first
    begun: deque[float] = field(default_factory=lambda: deque(maxlen=BEGUN_MAX))

    def began(self, now: float, n: int) -> None:
        """``n`` starts began at ``now``."""
        self.begun.extend([now] * n)

    def ended(self, now: float, ready: bool) -> None:
        """A start ended, ``ready`` or failed; it is matched with the oldest
        start under way (a function's starts take about as long as each
        other). A failed start's time is not a start time: not sampled."""
        if self.begun:
            t = self.begun.popleft()
            if ready and now >= t:
                self.start_s = _avg(self.start_s, now - t)

    def served(self, held_s: float) -> None:
        """A lease was released after ``held_s`` seconds."""
        self.service_s = _avg(self.service_s, held_s)

    def slots_for(self, waiting: int, busy_s: float = 0.0) -> int:
        """Slots ``waiting`` requests need within the time a start takes
        (see the module docstring): ``waiting`` when a request holds a slot
        as long as a start takes or either time is unknown. ``busy_s``, how
        long the requests in flight have held their slots so far, bounds
        the service time from below: requests far longer than the last
        ones (held, say, until their caller lets go) are not taken for
        short ones while they fill every slot."""
        s, t = self.start_s, self.service_s if self.service_s > busy_s else busy_s
        if waiting <= 0 or not s > t > 0.0:
            return waiting
        return math.ceil(waiting * t / s)
