"""A machine whose CPU cores the processes (stations) placed on it share.

Used where the simulator models one real machine: the fidelity check
simulates the emulated cluster that runs on this machine, so every process
-- control functions, node agents, the load generator -- shares its cores
with the others and with other users' work, much as Linux shares them.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine import Station


class Host:
    """CPU cores shared by the processes (stations) placed on it.

    Each process is single-threaded: a job of a process that is still busy
    continues on the core its previous job holds; a job of an idle process
    takes the core that frees first (FIFO in submission order). Submit jobs
    at their arrival (``Sim.slack_s = 0``) so a core is never held for a job
    that has not arrived yet.

    ``background`` is other work on the machine: k CPU-bound processes
    (estimated from the cores others took during the real run). Each core
    is theirs a share of the time, in bursts of one kernel time slice on
    average (exponential bursts and gaps, an alternating renewal process per
    core, drawn lazily): k/cores while ours leave room; when r of our
    processes have work and k + r > cores, each of the k + r gets its fair
    share cores/(k + r), so a core of ours is theirs 1 - cores/(k + r) of the
    time. A job of a busy process of ours is then interrupted by the bursts
    that fall due while it runs (time slicing); a waking one preempts
    the burst under way at the end of its slice, U(0, slice) later, and runs
    through (it has used far less CPU than a hog), the burst resuming after.

    ``wake_cpu_s``: a message to a process idle for longer than
    ``IDLE_AFTER_S`` costs that much more CPU (its gRPC and event-loop
    threads went to sleep and must be woken; measured with the echo, about
    the cost of the call itself on the reference VM). The per-op costs come
    from saturated runs, where processes seldom sleep.

    ``wakeup_s``: a job that finds its core idle for longer than
    ``HALT_AFTER_S`` (halted) starts that much later. On a VM, waking a
    halted vCPU goes through the hypervisor; `galaxy simulate-calibrate`
    measures it from the round trip of calls spaced 10 ms apart against
    back-to-back ones (0.5 ms per wake on the reference VM, 40x the loopback
    hop).

    With ``slice_s`` > 0 the kernel's time slicing is modelled too: while
    more processes have work than there are cores, a job of length s loses
    its core mid-way with probability s/slice_s (a slice boundary falls
    inside it) and then waits, on average, the slices of the others:
    slice_s x (k - cores)/cores for k of the host's processes with work (the
    background's share is taken by its bursts). The core is meanwhile used
    by others, so capacity is unchanged; only that job's process is late.
    (Measured with ``python -m simulator.calibrate_preempt``, 2026-11-29,
    load average 31-36: 15 us pieces of work are stretched past 100 us in
    0.2-0.4% of cases in a process that mostly sleeps, 1.2-1.5% in one busy
    a third of the time, 1.8-3% beside 2-4 CPU-bound processes, at any
    position in the busy period: s/slice_s = 1% is within that range.)

    ``began`` is when the last job placed started on its core: short work
    that continues a running process (a credit's ``take`` on Dispatch) is
    timed from there, as production times it, so a wait for the core before
    it is not within its span; a preemption within it is.
    """

    __slots__ = (
        "_bg_burst",
        "_bg_end",
        "_bg_gap",
        "_bg_last",
        "_bg_start",
        "_placing",
        "_rand",
        "background",
        "began",
        "free",
        "handoffs",
        "measured",
        "owner",
        "slice_s",
        "stations",
        "wake_cpu_s",
        "wakeup_s",
    )

    #: An idle core halts after this long: the guest's haltpoll cpuidle
    #: governor polls for 200 us first (Linux ``guest_halt_poll_ns`` default).
    HALT_AFTER_S = 0.0002
    #: A process idle this long has put its threads to sleep: the next
    #: message costs ``wake_cpu_s`` more CPU (measured: a gRPC echo costs the
    #: same CPU per call at 0.5 ms spacing as back to back, most of the extra
    #: at 2 ms, all of it at 10 ms).
    IDLE_AFTER_S = 0.001

    def __init__(
        self,
        cores: int,
        slice_s: float = 0.0,
        seed: int = 0,
        background: float = 0.0,
        wakeup_s: float = 0.0,
        handoffs: int = 1,
        wake_cpu_s: float = 0.0,
    ) -> None:
        if cores < 1:
            raise ValueError("a host needs at least one core")
        if not 0.0 <= background < math.inf:
            raise ValueError(f"background must be >= 0 processes, not {background}")
        self.free = [0.0] * cores  # when each core is next free
        #: the process whose job was last put on each core
        self.owner: list[Station | None] = [None] * cores
        self.slice_s = slice_s
        #: CPU-bound processes of other users on the machine
        self.background = background
        self.stations: list[Station] = []
        #: when the last job placed started running on its core (after any
        #: wait for the core; preemptions from then on are within it)
        self.began = 0.0
        self._placing: Station | None = None  # the process whose job is being placed
        self._rand = random.Random(seed)
        self._bg_burst = slice_s if slice_s > 0 else 0.001  # mean burst: one slice
        # math.inf: no background (the gap's mean is drawn per burst, below)
        self._bg_gap = 1.0 if background > 0 else math.inf
        self.wakeup_s = wakeup_s
        #: extra CPU a message to a process idle for IDLE_AFTER_S costs
        self.wake_cpu_s = wake_cpu_s
        #: processes whose per-job cost was measured whole (wakes included)
        self.measured: set[Station] = set()
        if handoffs < 1:
            raise ValueError("a message needs at least one thread to run it")
        #: threads a message to a sleeping process wakes in turn (each must
        #: get a core) before its handler runs
        self.handoffs = handoffs
        self._bg_start = [math.inf] * cores
        self._bg_end = [0.0] * cores
        self._bg_last = [0.0] * cores  # end of each core's last burst
        if background > 0:
            for c in range(cores):
                self._next_burst(c)

    def _next_burst(self, core: int) -> None:
        """Draw the core's next background burst (after its current one)."""
        t = self._bg_last[core] = self._bg_end[core]
        # How often the others hold a core: all they want while ours leave
        # room (k <= cores - r); when k + r processes compete, each gets
        # cores/(k + r) of a core, so a core of ours is theirs the rest.
        k, r, c = self.background, self._ours_with_work(t), len(self.free)
        share = k / c if k + r <= c else 1 - c / (k + r)
        gap = self._bg_burst * (1 - share) / share
        s = t + self._rand.expovariate(1 / gap)
        self._bg_start[core] = s
        self._bg_end[core] = s + self._rand.expovariate(1 / self._bg_burst)

    def _ours_with_work(self, t: float) -> int:
        return sum(1 for st in self.stations if st.free_at > t or st is self._placing)

    def ready(self, core: int, t: float, waking: bool = False) -> float:
        """When ``core`` can start a job that wants it at ``t``: after our
        jobs on it and a background burst under way -- which a ``waking``
        process (one that was sleeping, so it has used less CPU than a hog)
        preempts once the burst's slice runs out, U(0, slice_s) later."""
        t = max(t, self.free[core])
        if self._bg_gap == math.inf:
            return t
        while self._bg_end[core] <= t:
            self._next_burst(core)
        if self._bg_start[core] > t:
            return t
        if waking and self.slice_s > 0:
            return min(self._bg_end[core], t + self._rand.uniform(0.0, self.slice_s))
        return self._bg_end[core]

    def run(self, core: int, start: float, service: float, waking: bool = False) -> float:
        """Run a job of ``service`` s on ``core`` from ``start``; when it ends.

        A job of a busy process is interrupted by background bursts that
        fall due meanwhile (the kernel shares the core by time slices, and
        what the others used was measured as theirs). A job of a ``waking``
        process runs through: the burst it preempted, or one due while it
        runs, resumes after it (the others' work is conserved, only later)."""
        t = self.began = start
        if self._bg_gap != math.inf:
            while self._bg_end[core] <= t:
                self._next_burst(core)
            if waking:
                end = t + service
                s0 = self._bg_start[core]
                if s0 <= t:
                    self._bg_end[core] += service
                elif s0 < end:
                    self._bg_start[core] = end
                    self._bg_end[core] += end - s0
                self.free[core] = end
                return end
            # Room for all (k + r <= cores): the others run on other cores.
            roomy = self.background + self._ours_with_work(t) <= len(self.free)
            ran = False
            while not roomy:
                while self._bg_end[core] <= t:
                    self._next_burst(core)
                s0 = self._bg_start[core]
                if s0 <= t:
                    t = self._bg_end[core]  # a burst under way: wait it out
                    if not ran:
                        self.began = t
                    continue
                ran = True
                if t + service <= s0:
                    break
                service -= s0 - t  # runs up to the burst, then waits it out
                t = self._bg_end[core]
        t += service
        self.free[core] = t
        return t

    def place(self, st: Station, t: float, start: float, service: float) -> float:
        """Run a job of process ``st`` arriving at ``t`` (its own queue lets
        it start at ``start``); when it is done."""
        self._placing = st
        free = self.free
        if st.free_at >= t and st.core >= 0 and free[st.core] == st.free_at:
            core = st.core  # busy: the process keeps its core
            end = self.run(core, start, service)
        else:
            if (
                self.wake_cpu_s > 0
                and t - st.free_at > self.IDLE_AFTER_S
                and st not in self.measured
            ):
                service += self.wake_cpu_s  # its threads were asleep
                st.busy += self.wake_cpu_s
            for _ in range(self.handoffs - 1):
                # A thread that only passes the message on: it needs a core,
                # then hands over (its CPU is in the calibrated op costs).
                start = min(self.ready(c, start, True) for c in range(len(free)))
            ready = [self.ready(c, start, True) for c in range(len(free))]
            core = min(range(len(free)), key=ready.__getitem__)
            owner = self.owner[core]
            wake = start + (self._rand.uniform(0.0, self.slice_s) if self.slice_s > 0 else 0.0)
            if (
                owner is not None
                and owner is not st
                and wake < ready[core]
                and owner.core == core
                and owner.free_at == free[core]
                and st.busy - service < owner.busy - (owner.free_at - start)
            ):
                # The kernel runs the waking process first: it has used less
                # CPU so far (lower vruntime) than the one holding the core,
                # which loses the core at the end of its slice and resumes
                # after. (Jobs of the owner already given end times keep
                # them: the core is briefly double-booked, and what the owner
                # does next starts later by our service, so work is conserved
                # over its busy period.)
                held = free[core]
                end = self.run(core, wake, service, True)
                free[core] = owner.free_at = held + (end - wake)
                st.core = core
                return end + self.preemption(st, wake, service)
            start = ready[core]
            if self.wakeup_s > 0 and start == t and self._halted(core, t):
                start += self.wakeup_s  # the core must be woken first
            end = self.run(core, start, service, True)
        self.owner[core] = st
        st.core = core
        return end + self.preemption(st, start, service)

    def _halted(self, core: int, t: float) -> bool:
        """Has ``core`` been idle long enough at ``t`` to have halted?"""
        last = max(self.free[core], self._bg_last[core])
        if self._bg_start[core] <= t < self._bg_end[core]:
            return False
        return t - last > self.HALT_AFTER_S

    def preemption(self, me: Station, start: float, service: float) -> float:
        """The extra delay of a job of ``me`` that starts at ``start``."""
        if self.slice_s <= 0 or self._rand.random() >= service / self.slice_s:
            return 0.0
        # Ours only: the background's share of the cores is taken by its bursts.
        k = 1 + sum(1 for st in self.stations if st is not me and st.free_at > start)
        c = len(self.free)
        if k <= c:
            return 0.0
        return self._rand.expovariate(c / (self.slice_s * (k - c)))
