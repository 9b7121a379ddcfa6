"""A Python asyncio process, iteration by iteration (used on a shared ``Host``).

A ``Station`` alone is a FIFO queue: a message waits once for the work
queued ahead of it and is then served whole. A grpc.aio process is not
that. Its event loop runs in iterations, each running every callback that
was ready when it began, and a message crosses several iterations before
its handler runs: the poller's completion for the new call is handled, the
server's accept loop resumes and creates the RPC's task, the task asks for
the request message, that completion is handled, the task resumes into the
handler. A reply to a call the process made crosses fewer: the completion,
the call's own task, the awaiting coroutine. Counted on this machine with
``python -m controlplane.bench.loopsteps`` (grpcio 1.85.1): 8 iterations
from a call waking the server to its handler, 3 from a reply waking the
client to the caller resuming; `galaxy simulate-calibrate` measures them
again. Each iteration is run behind one step of every other task in
flight, so a message's latency is several rounds of whatever else the
process is doing, not one wait behind a queue; and new calls are accepted
one per iteration (the accept loop asks for the next call only after taking
one), so under a backlog replies to calls in flight overtake new calls.

``EventLoop`` models exactly that: tasks in flight each take one step per
iteration; a new message joins at most one per iteration; the iteration's
CPU is the handlers that run in it (the calibrated op costs, which are CPU
per operation and so already hold the loop's own overhead), served by the
process's ``Station`` (so a process still shares its host's cores, and jobs
given to the station directly -- the sends a handler makes -- run in the
iteration that made them).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.engine import Callback, Sim, Station

#: Iterations from a new call's arrival to its handler running (measured,
#: see above; the calibration's ``loop_request_steps`` when it has one).
REQUEST_STEPS = 8
#: Iterations from a reply's arrival to the caller resuming (``loop_reply_steps``).
REPLY_STEPS = 3


class EventLoop:
    """The event loop of the process ``station``; see the module docstring."""

    __slots__ = ("_accept", "_ready", "_running", "reply_steps", "request_steps", "sim", "station")

    def __init__(
        self,
        sim: Sim,
        station: Station,
        request_steps: int = REQUEST_STEPS,
        reply_steps: int = REPLY_STEPS,
    ) -> None:
        if request_steps < 1 or reply_steps < 1:
            raise ValueError("a message takes at least one loop iteration")
        self.sim = sim
        self.station = station
        self.request_steps = request_steps
        self.reply_steps = reply_steps
        #: tasks in flight: [iterations left, handler CPU, then, arg]
        self._ready: list[list[Any]] = []
        #: new calls not yet accepted
        self._accept: deque[list[Any]] = deque()
        self._running = False

    def deliver(self, arrive: float, service: float, then: Callback, arg: Any, reply: bool) -> None:
        """A message arrives at ``arrive``; its handler needs ``service`` s of
        CPU, after which then(arg) is called. ``reply``: the answer to a call
        this process made (else a new call)."""
        self.sim.at(arrive, self._arrive, (service, then, arg, reply))

    def _arrive(self, a: tuple[float, Callback, Any, bool]) -> None:
        service, then, arg, reply = a
        if reply:
            self._ready.append([self.reply_steps, service, then, arg])
        else:
            self._accept.append([self.request_steps, service, then, arg])
        if not self._running:
            self._running = True
            self._iterate(None)

    def _iterate(self, _: Any) -> None:
        batch, self._ready = self._ready, []
        if self._accept:
            batch.append(self._accept.popleft())  # one new call per iteration
        cost = 0.0
        done = []
        for item in batch:
            item[0] -= 1
            if item[0] == 0:
                cost += item[1]
                done.append(item)
            else:
                self._ready.append(item)
        # Even an iteration that runs no handler waits for the process (and
        # wakes it: the station charges the wake-up of an idle process).
        end = self.station.finish(self.sim.now, cost)
        at = self.sim.at
        for item in done:
            at(end, item[2], item[3])
        if self._ready or self._accept:
            at(end, self._iterate, None)  # after the handlers' own follow-ups
        else:
            self._running = False

    def in_flight(self) -> int:
        """Messages taken and not yet handled, and calls not yet accepted."""
        return len(self._ready) + len(self._accept)
