"""The discrete-event core: a virtual clock, an event heap and service stations.

Time is a ``controlplane.clock.ManualClock``: the production policy objects
take a clock, and the simulator hands them this one, so they read simulated
time without knowing it.

Events are ``(time, seq, callback, arg)`` tuples on a ``heapq``; ``seq``
makes equal times fire in scheduling order, so a run is a pure function of
its seed. Workload arrivals are not pushed on the heap: they come from a
sorted stream that the loop merges with the heap (one heap operation saved
per request, and memory bounded to one batch of arrivals).

A ``Station`` is a process that serves operations one (or ``c``) at a time in
FIFO order, e.g. one control function instance. It needs no events of its
own: ``finish(arrival, service)`` is Lindley's recursion (start = max(arrival,
server free), done = start + service), exact for FIFO queues when jobs are
submitted in arrival order. A job arriving within ``SLACK_S`` is submitted
when sent (saving an event); one arriving later -- behind a backed-up
upstream station -- is submitted by an event at its arrival (``pipeline``),
so service order differs from arrival order by at most ``SLACK_S`` plus the
network jitter. A ``Host`` models processes sharing CPU cores (the emulated
cluster on one machine): a job also waits for a free core of its host.
"""

from __future__ import annotations

import heapq
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from controlplane.clock import ManualClock

Callback = Callable[[Any], None]
#: (station, service time, delay after it before the next stage)
Stage = tuple["Station", float, float]
#: A job is handed to a station when sent if it arrives within this much;
#: later arrivals are handed over at their arrival time (see ``pipeline``).
SLACK_S = 0.001
#: One batch of arrivals: (times, function indices, durations), sorted by time.
Batch = tuple[Sequence[float], Sequence[int], Sequence[float]]
ArrivalFn = Callable[[int, float], None]


class Sim:
    """Event loop over a simulated clock. ``events`` counts processed events."""

    def __init__(self, start: float = 0.0) -> None:
        self.clock = ManualClock(start)
        #: simulated time in seconds (an attribute, not a property: it is read
        #: on every event; the loop moves it with the clock)
        self.now = start
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = 0
        self.events = 0
        self.stopped = False
        #: see ``pipeline``; 0 submits every job at its arrival (exact order)
        self.slack_s = SLACK_S

    def at(self, t: float, fn: Callback, arg: Any = None) -> None:
        """Call fn(arg) at time t (not earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, arg))

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
        t = arrive
        for i, (st, service, gap) in enumerate(stages):
            if t - self.now > self.slack_s:
                self.at(t, self._resume, (stages[i:], then, arg))
                return
            t = st.finish(t, service) + gap
        self.at(t, then, arg)

    def _resume(self, a: tuple[list[Stage], Callback, Any]) -> None:
        self.pipeline(self.now, a[0], a[1], a[2])

    def pending(self) -> int:
        """Events scheduled and not yet run."""
        return len(self._heap)

    def run(
        self,
        until: float = math.inf,
        arrivals: Iterator[Batch] | None = None,
        on_arrival: ArrivalFn | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Run events (and merged arrivals) up to time ``until``.

        on_arrival(function_index, duration) is called at each arrival time.
        """
        heap, pop, clock = self._heap, heapq.heappop, self.clock
        times: Sequence[float] = ()
        fns: Sequence[int] = ()
        durs: Sequence[float] = ()
        i = n = 0
        next_arrival = math.inf
        events = self.events
        check = events + 4096
        while not self.stopped:
            if i >= n and arrivals is not None:
                # Refill from the next non-empty batch (or finish the stream).
                for batch in arrivals:
                    if len(batch[0]):
                        times, fns, durs = batch
                        break
                else:
                    times, arrivals = (), None
                i, n = 0, len(times)
                next_arrival = times[0] if n else math.inf
            if heap and heap[0][0] <= next_arrival:
                t = heap[0][0]
                if t > until:
                    break
                _, _, fn, arg = pop(heap)
                clock.set(t)
                self.now = t
                fn(arg)
            elif next_arrival != math.inf:
                if next_arrival > until:
                    break
                clock.set(next_arrival)
                self.now = next_arrival
                assert on_arrival is not None
                on_arrival(fns[i], durs[i])
                i += 1
                next_arrival = times[i] if i < n else math.inf
            else:
                break
            events += 1
            if events >= check:
                check = events + 4096
                if progress is not None:
                    progress.update(clock.now())
        self.events = events
        if until != math.inf and clock.now() < until and not self.stopped:
            clock.set(until)
            self.now = until
        if progress is not None:
            progress.update(clock.now(), final=True)

    def stop(self) -> None:
        """End ``run`` after the current event."""
        self.stopped = True


class Host:
    """CPU cores shared by the processes (stations) placed on it.

    Each process is single-threaded: a job of a process that is still busy
    continues on the core its previous job holds; a job of an idle process
    takes the core that frees first (FIFO in submission order). Submit jobs
    at their arrival (``Sim.slack_s = 0``) so a core is never held for a job
    that has not arrived yet.

    With ``slice_s`` > 0 the kernel's time slicing is modelled too: while
    more of the host's processes have work than there are cores, a job of
    length s loses its core mid-way with probability s/slice_s (a slice
    boundary falls inside it) and then waits, on average, the slices of the
    others: slice_s x (k - cores)/cores for k processes with work (those of
    the host plus ``background`` ones of other users). The core
    is meanwhile used by others, so capacity is unchanged; only that job's
    process is late.
    """

    __slots__ = ("_rand", "background", "free", "slice_s", "stations")

    def __init__(
        self, cores: int, slice_s: float = 0.0, seed: int = 0, background: float = 0.0
    ) -> None:
        if cores < 1:
            raise ValueError("a host needs at least one core")
        self.free = [0.0] * cores  # when each core is next free
        self.slice_s = slice_s
        #: runnable processes of others on the machine (e.g. its load average)
        self.background = background
        self.stations: list[Station] = []
        self._rand = random.Random(seed)

    def preemption(self, me: Station, start: float, service: float) -> float:
        """The extra delay of a job of ``me`` that starts at ``start``."""
        if self.slice_s <= 0 or self._rand.random() >= service / self.slice_s:
            return 0.0
        k = 1 + self.background
        k += sum(1 for st in self.stations if st is not me and st.free_at > start)
        c = len(self.free)
        if k <= c:
            return 0.0
        return self._rand.expovariate(c / (self.slice_s * (k - c)))


class Station:
    """A FIFO server with c parallel servers (see the module docstring).

    busy: total service time given; ops: operations served. Both feed load
    reports (ops/s, utilisation) to scaling policies.
    """

    __slots__ = ("_free", "busy", "c", "core", "free_at", "host", "name", "ops")

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

    def finish(self, t: float, service: float) -> float:
        """Serve a job arriving at t that needs ``service`` s; its finish time."""
        self.busy += service
        self.ops += 1
        if self.c == 1:
            start = t if t > self.free_at else self.free_at
        else:
            start = t if t > self._free[0] else self._free[0]
        if self.host is not None:
            cores = self.host.free
            if self.free_at >= t and self.core >= 0 and cores[self.core] == self.free_at:
                core = self.core  # busy: the process keeps its core
            else:
                core = min(range(len(cores)), key=cores.__getitem__)
                if cores[core] > start:
                    start = cores[core]
            cores[core] = start + service
            self.core = core
            done = start + service + self.host.preemption(self, start, service)
        else:
            done = start + service
        if self.c == 1:
            self.free_at = done
        else:
            heapq.heapreplace(self._free, done)
        return done

    def backlog(self, now: float) -> float:
        """Seconds of queued work ahead of a job arriving now."""
        nxt = self.free_at if self.c == 1 else self._free[0]
        return max(0.0, nxt - now)


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
