"""The discrete-event core: a virtual clock, an event heap and service stations.

Time is ``Sim.now``; the production policy objects take a
``controlplane.runtime.clock.Clock``, and the simulator hands them a ``SimClock``
that reads ``Sim.now``, so they read simulated time without knowing it.

Events run in time order, events at the same time in the order they were
scheduled, so a run is a pure function of its seed. The queue is a
``heapq`` of the event times (plain floats: cheaper to order than tuples)
and a dict from a time to its event (the later events sharing that time
wait in a FIFO of their own). Workload arrivals are not pushed on the heap:
they come from a sorted stream that the loop merges with the heap (one heap
operation saved per request, and memory bounded to one batch of arrivals).

A ``Station`` is a process that serves operations one (or ``c``) at a time in
FIFO order, e.g. one control function instance. It needs no events of its
own: ``finish(arrival, service)`` is Lindley's recursion (start = max(arrival,
server free), done = start + service), exact for FIFO queues when jobs are
submitted in arrival order. A job arriving within ``SLACK_S`` is submitted
when sent (saving an event); one arriving later -- behind a backed-up
upstream station -- is submitted by an event at its arrival (``pipeline``),
so service order differs from arrival order by at most ``SLACK_S`` plus the
network jitter. A station on a ``simulator.host.Host`` is a process sharing
the machine's CPU cores (the emulated cluster on one machine): a job also
waits for a core of its host.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from simulator.host import Host
    from simulator.loop import EventLoop

Callback = Callable[[Any], None]
#: (station, service time, delay after it before the next stage)
Stage = tuple["Station", float, float]
#: A job is handed to a station when sent if it arrives within this much;
#: later arrivals are handed over at their arrival time (see ``pipeline``).
SLACK_S = 0.001
#: One batch of arrivals: (times, function indices, durations), sorted by time.
Batch = tuple[Sequence[float], Sequence[int], Sequence[float]]
ArrivalFn = Callable[[int, float], None]
#: bound once: ``at`` runs for every event
_heappush = heapq.heappush


class SimClock:
    """A ``controlplane.runtime.clock.Clock`` on simulated time: it reads ``Sim.now``
    (so the loop moves one attribute per event, not a clock too)."""

    __slots__ = ("_sim",)

    def __init__(self, sim: Sim) -> None:
        self._sim = sim

    def now(self) -> float:
        """The simulated time in seconds."""
        return self._sim.now


class Sim:
    """Event loop over a simulated clock. ``events`` counts processed events."""

    def __init__(self, start: float = 0.0) -> None:
        #: simulated time in seconds (an attribute, not a property: it is read
        #: on every event); it only moves forward
        self.now = start
        #: the time as a ``Clock`` for the production policies
        self.clock = SimClock(self)
        #: the times of the pending events, one entry per event: a heap of
        #: floats (cheaper to order than tuples of (time, seq, ...))
        self._times: list[float] = []
        #: time -> the first event due then, (fn, arg) (typed Any: ``at``
        #: compares identities, and the optional compiled build would
        #: unbox a typed tuple and box a new one for each comparison)
        self._due: dict[float, Any] = {}
        #: time -> the events due then after the one in ``_due``, in the
        #: order they were scheduled (rare: kept apart, so that an event
        #: needs no check for them while this is empty)
        self._more: dict[float, deque[tuple[Callback, Any]]] = {}
        self.events = 0
        self.stopped = False
        #: see ``pipeline``; 0 submits every job at its arrival (exact order)
        self.slack_s = SLACK_S

    def at(self, t: float, fn: Callback, arg: Any = None) -> None:
        """Call fn(arg) at time t (not earlier than now)."""
        ev: Any = (fn, arg)
        # One dict operation when t is free (nearly always): setdefault
        # returns ev itself then.
        if self._due.setdefault(t, ev) is not ev:
            q = self._more.get(t)
            if q is None:
                self._more[t] = deque((ev,))
            else:
                q.append(ev)
        _heappush(self._times, t)

    def after(self, dt: float, fn: Callback, arg: Any = None) -> None:
        """Call fn(arg) dt seconds from now."""
        self.at(self.now + dt, fn, arg)

    def every(self, period: float, fn: Callable[[], None], first: float | None = None) -> None:
        """Call fn() every period seconds from ``first`` (default: one period
        from now) until the run ends."""

        def tick(_: Any) -> None:
            fn()
            self.after(period, tick)

        self.at(self.now + period if first is None else first, tick)

    def pipeline(self, arrive: float, stages: list[Stage], then: Callback, arg: Any) -> None:
        """Pass a job arriving at ``arrive`` through stations in order, then
        call then(arg). A stage whose arrival is more than ``slack_s`` away
        is entered by an event at that time, so each station still serves
        jobs in (nearly) arrival order even behind a backed-up upstream."""
        t, now, slack = arrive, self.now, self.slack_s
        for i, (st, service, gap) in enumerate(stages):
            if t - now > slack:
                self.at(t, self._resume, (stages[i:], then, arg))
                return
            t = st.finish(t, service) + gap
        self.at(t, then, arg)

    def stage(self, arrive: float, st: Station, service: float, then: Callback, arg: Any) -> None:
        """``pipeline(arrive, [(st, service, 0.0)], then, arg)``: one station
        (most messages), without the list and the loop."""
        if st.loop is not None:  # an event loop (simulator.loop): a new call
            st.loop.deliver(arrive, service, then, arg, False)
            return
        if arrive - self.now > self.slack_s:
            self.at(arrive, self._resume, ([(st, service, 0.0)], then, arg))
            return
        self.at(st.finish(arrive, service), then, arg)

    def reply(self, arrive: float, st: Station, service: float, then: Callback, arg: Any) -> None:
        """``stage`` for the answer to a call ``st`` made: the same on a
        FIFO station; an event loop resumes the caller in fewer iterations
        than it takes to accept a new call."""
        if st.loop is not None:
            st.loop.deliver(arrive, service, then, arg, True)
            return
        self.stage(arrive, st, service, then, arg)

    def _resume(self, a: tuple[list[Stage], Callback, Any]) -> None:
        self.pipeline(self.now, a[0], a[1], a[2])

    def pending(self) -> int:
        """Events scheduled and not yet run."""
        return len(self._times)

    def run(
        self,
        until: float = math.inf,
        arrivals: Iterator[Batch] | None = None,
        on_arrival: ArrivalFn | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Run events (and merged arrivals) up to time ``until``.

        on_arrival(function_index, duration) is called at each arrival time.
        An event and an arrival at the same time: the event first.
        """
        heap, pop, due, more = self._times, heapq.heappop, self._due, self._more
        take = due.pop
        inf = math.inf
        arrive = on_arrival if on_arrival is not None else _no_on_arrival
        times: Sequence[float] = ()
        fns: Sequence[int] = ()
        durs: Sequence[float] = ()
        i = n = 0
        next_arrival = inf
        events = self.events
        check = events + 4096
        now = self.now
        while not self.stopped:
            if events >= check:
                check = events + 4096
                if progress is not None:
                    progress.update(now)
            if i >= n and arrivals is not None:
                # Refill from the next non-empty batch (or finish the stream).
                for batch in arrivals:
                    if len(batch[0]):
                        times, fns, durs = batch
                        break
                else:
                    times, arrivals = (), None
                i, n = 0, len(times)
                next_arrival = times[0] if n else inf
            limit = next_arrival if next_arrival < until else until
            if heap and heap[0] <= limit:
                # The events due before the next arrival, in a tight loop.
                while True:
                    t = pop(heap)
                    fn, arg = take(t)
                    if more and t in more:  # the next event at t moves up
                        q = more[t]
                        due[t] = q.popleft()
                        if not q:
                            del more[t]
                    if t < now:
                        raise ValueError(f"an event at {t} is in the past (now {now})")
                    self.now = now = t
                    fn(arg)
                    events += 1
                    if not heap or heap[0] > limit or self.stopped or events >= check:
                        break
            elif next_arrival <= until and next_arrival != inf:
                self.now = now = next_arrival
                arrive(fns[i], durs[i])
                events += 1
                i += 1
                next_arrival = times[i] if i < n else inf
            else:
                break
        self.events = events
        if until != math.inf and now < until and not self.stopped:
            self.now = until
        if progress is not None:
            progress.update(self.now, final=True)

    def stop(self) -> None:
        """End ``run`` after the current event."""
        self.stopped = True


def _no_on_arrival(fn: int, duration: float) -> None:
    raise TypeError("Sim.run got arrivals but no on_arrival")


class Station:
    """A FIFO server with c parallel servers (see the module docstring).

    busy: total service time given; ops: operations served. Both feed load
    reports (ops/s, utilisation) to scaling policies.
    """

    __slots__ = ("_free", "_lone", "busy", "c", "core", "free_at", "host", "loop", "name", "ops")

    def __init__(self, name: str = "", c: int = 1, host: Host | None = None) -> None:
        if c < 1:
            raise ValueError("a station needs at least one server")
        self.name = name
        self.c = c
        self.host = host
        if host is not None:
            if c != 1:
                raise ValueError("a station on a shared host is one process (c = 1)")
            host.stations.append(self)
        self.core = -1  # the host core its last job ran on
        self.free_at = 0.0  # single server: when it is next free
        self._free = [0.0] * c  # c > 1: free times of the servers (a heap)
        self.busy = 0.0
        self.ops = 0
        #: messages go through this event loop (``simulator.loop``) if set
        self.loop: EventLoop | None = None
        #: one server with a core of its own (no host): ``finish`` is then
        #: Lindley's recursion alone, its first and cheapest case
        self._lone = c == 1 and host is None

    def finish(self, t: float, service: float) -> float:
        """Serve a job arriving at t that needs ``service`` s; its finish time."""
        self.busy += service
        self.ops += 1
        if self._lone:
            free = self.free_at
            done = (t if t > free else free) + service
            self.free_at = done
            return done
        host = self.host
        if self.c == 1:
            free = self.free_at
            start = t if t > free else free
            done = start + service if host is None else host.place(self, t, start, service)
            self.free_at = done
            return done
        free = self._free[0]
        start = t if t > free else free
        done = start + service if host is None else host.place(self, t, start, service)
        heapq.heapreplace(self._free, done)
        return done

    def then(self, t: float, service: float) -> float:
        """Serve work that continues the job this process just finished at
        ``t`` (e.g. the RPC a handler sends right after deciding): like an
        event loop running the rest of a task step, it goes before jobs
        queued behind that one, which start later by ``service``. Those jobs'
        end times, already given out, are kept (an approximation)."""
        if self.c != 1 or self.free_at <= t:
            return self.finish(t, service)
        self.busy += service
        self.ops += 1
        done = t + service
        self.free_at += service
        h = self.host
        if h is not None and self.core >= 0 and h.free[self.core] == self.free_at - service:
            h.free[self.core] = self.free_at
        return done

    def backlog(self, now: float) -> float:
        """Seconds of queued work ahead of a job arriving now."""
        nxt = self.free_at if self.c == 1 else self._free[0]
        ahead = nxt - now
        return ahead if ahead > 0.0 else 0.0  # max(0.0, ahead), cheaper


class Progress:
    """A one-line progress bar on a terminal (stderr) for long runs."""

    def __init__(
        self, label: str, end: float, out: TextIO | None = None, min_wall_s: float = 2.0
    ) -> None:
        self.label = label
        self.end = max(end, 1e-9)
        self.out = out if out is not None else sys.stderr
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._shown = False
        # Short runs print nothing: a bar only helps when a run takes a while.
        self.min_wall_s = min_wall_s

    def update(self, now: float, final: bool = False) -> None:
        """Redraw when half a second has passed (and at the end if shown)."""
        wall = time.perf_counter()
        if not final and (wall - self._last < 0.5 or wall - self.t0 < self.min_wall_s):
            return
        if final and not self._shown:
            return
        self._last = wall
        self._shown = True
        frac = min(1.0, now / self.end)
        bar = "#" * int(frac * 30)
        eta = (wall - self.t0) * (1 - frac) / frac if frac > 0 else 0.0
        self.out.write(
            f"\r{self.label:<14} [{bar:<30}] {frac * 100:5.1f}% sim {now:8.1f}s "
            f"wall {wall - self.t0:6.1f}s eta {eta:5.0f}s"
        )
        if final:
            self.out.write("\n")
        self.out.flush()
