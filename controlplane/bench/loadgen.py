"""The load generator: a process of its own, so its CPU is not the servers'.

    python -m controlplane.bench.loadgen --job JOB.json --out RESULT.json

Open loop (``mode: open``): request i is due at ``t0 + t_i`` whatever the
server does, and its latency is measured from that *intended* send time, so
a server that falls behind shows its queueing instead of slowing the
generator down (no coordinated omission). The generator's own lateness is
reported as ``lag_ms``; when that grows, the generator was the limit.

Closed loop (``mode: closed``): ``concurrency`` workers send back to back;
this finds the maximum throughput at that concurrency. Latency is then from
the actual send.

Targets: ``galaxy`` (Dispatch through the SDK, then Release, or hold the
lease as the job says) and ``echo`` (the raw grpc.aio echo, same concurrency).
Prints ``LOADGEN_MEASURING`` when the first measured request is due and
``LOADGEN_MEASURED`` when the last one is done (before held leases are
released): the runner scrapes metrics, reads CPU times and runs profilers
between the two. The generator's own CPU time over that span is in the result.
With ``handshake`` the generator waits for a line on stdin after
``LOADGEN_MEASURING`` before the first measured request: the runner's
snapshot (a /metrics scrape of every process, each tens of milliseconds of
its CPU) then happens between warm-up and measurement instead of stalling
the first measured requests (it made 2% of a warm phase's requests 18-70 ms
slow: docs/results/benchmarks-2026-11.md, 2026-11-26, commit dab33f3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc

from controlplane.bench.echo import METHOD as ECHO_METHOD
from controlplane.runtime import gctune
from controlplane.runtime.config import GcConfig
from controlplane.runtime.errors import GalaxyError

MEASURING = "LOADGEN_MEASURING"
MEASURED = "LOADGEN_MEASURED"
#: The longest the generator waits for the runner's go-ahead.
HANDSHAKE_S = 60.0
_PRIME_CONCURRENCY = 64


@dataclass
class Job:
    """What to run (the JSON the runner writes)."""

    target: str  # galaxy | echo
    address: str  # controller (galaxy) or echo server
    mode: str = "closed"  # open | closed
    concurrency: int = 16
    functions: list[str] = field(default_factory=list)
    # (intended send s, function index, hold ms: 0 release now, >0 later, -1 at the end)
    requests: list[tuple[float, int, float]] = field(default_factory=list)
    prime: list[tuple[int, float]] = field(default_factory=list)
    warmup: int = 0
    timeout_s: float = 10.0
    max_duration_s: float = 120.0
    payload_bytes: int = 64
    # Wait for a line on stdin after announcing the measured phase (the
    # runner answers once its snapshot is taken); at most HANDSHAKE_S.
    handshake: bool = False
    # Dispatch requests on the SDK's streams (False: a unary call each).
    streams: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        """From the job JSON."""
        j = cls(**d)
        j.requests = [(float(t), int(f), float(h)) for t, f, h in j.requests]
        j.prime = [(int(f), float(h)) for f, h in j.prime]
        return j


@dataclass
class _Rec:
    t_ms: list[float] = field(default_factory=list)  # send, from the measure start
    lat_ms: list[float] = field(default_factory=list)
    cold: list[int] = field(default_factory=list)
    wait_ms: list[float] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    release_errors: Counter[str] = field(default_factory=Counter)
    prime_errors: Counter[str] = field(default_factory=Counter)
    rpcs: int = 0
    start: float | None = None
    end: float = 0.0
    cpu_start: float = 0.0
    cpu_end: float = 0.0


async def _until(due: float) -> float:
    """Sleep until about ``due`` (perf_counter time); returns the time then.

    One timer, no busy wait: uvloop's timers have millisecond resolution and
    may fire up to about a millisecond early. Spinning on ``sleep(0)`` until
    the exact time cost the generator ~0.3 cores at 400 requests/s, taken
    from the servers it measures on a 2-core machine (docs/results/benchmarks-2026-11.md,
    2026-11-25, commit 95304db). A request that goes out early is timed from its actual
    send instead (``_start``), so its latency is never understated.
    """
    now = time.perf_counter()
    if due > now:
        await asyncio.sleep(due - now)
        now = time.perf_counter()
    return now


async def _go_ahead(timeout_s: float) -> None:
    """Wait for a line on stdin (the runner's go-ahead), at most timeout_s;
    end of input or the timeout go ahead too (a runner that died must not
    hang the generator: its own deadline ends the run)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        await asyncio.wait_for(reader.readline(), timeout_s)
    except TimeoutError:
        print(f"no go-ahead on stdin within {timeout_s:g}s; measuring anyway", file=sys.stderr)
    finally:
        transport.close()


# A failed call: the raw echo raises gRPC's error, the SDK its typed one.
_FAILED = (grpc.aio.AioRpcError, GalaxyError)


def _code(e: grpc.aio.AioRpcError | GalaxyError) -> str:
    """The status code name of a failed call."""
    return e.code.name if isinstance(e, GalaxyError) else e.code().name


def _start(due: float, now: float) -> float:
    """When an open-loop request's latency starts: its intended send time
    (a late generator's wait counts: no coordinated omission), or its actual
    send if the timer fired early (never from before the send)."""
    return min(due, now)


class LoadGen:
    """Runs one job; see the module docstring."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.rec = _Rec()
        self.held: list[Any] = []
        self._bg: set[asyncio.Task[None]] = set()
        self._client: Any = None
        self._echo: Any = None
        self._payload = b"x" * job.payload_bytes
        self._announced = False
        self._measuring = asyncio.Event()

    async def __aenter__(self) -> LoadGen:
        if self.job.target == "galaxy":
            from controlplane.sdk.client import GalaxyClient

            self._client = GalaxyClient(
                self.job.address, timeout=self.job.timeout_s, streams=self.job.streams
            )
            await self._client.refresh_membership()
        elif self.job.target == "echo":
            self._channel = grpc.aio.insecure_channel(self.job.address)
            self._echo = self._channel.unary_unary(ECHO_METHOD)
        else:
            raise ValueError(f"target: galaxy or echo, got {self.job.target!r}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
        if self._echo is not None:
            await self._channel.close()

    # -- one request ------------------------------------------------------

    async def _one(
        self, fn: int, hold: float, start: float, measured: bool, due: float | None = None
    ) -> None:
        """One request; its latency runs from ``start``; ``due``: its place
        in the schedule (default ``start``)."""
        rec = self.rec
        try:
            if self._echo is not None:
                await self._echo(self._payload, timeout=self.job.timeout_s)
                addr = None
            else:
                addr = await self._client.dispatch(self.job.functions[fn])
        except _FAILED as e:
            if measured:
                rec.errors[_code(e)] += 1
                rec.rpcs += 1
                rec.end = max(rec.end, time.perf_counter())
            return
        done = time.perf_counter()
        if measured:
            assert rec.start is not None
            rec.t_ms.append(((start if due is None else due) - rec.start) * 1000.0)
            rec.lat_ms.append((done - start) * 1000.0)
            rec.cold.append(int(bool(addr is not None and addr.cold_start)))
            rec.wait_ms.append(addr.wait_ms if addr is not None else 0.0)
            rec.rpcs += 1
        if addr is not None:
            if hold == 0:
                await self._release(addr, measured)
            elif hold > 0:
                self._spawn(self._release_later(addr, hold / 1000.0, measured))
            else:
                self.held.append(addr)
        if measured:
            rec.end = max(rec.end, time.perf_counter())

    async def _release(self, addr: Any, measured: bool = False) -> None:
        # Deferred, as the SDK's invoke() does: the release rides on the next
        # Dispatch to the same owner, so it costs no RPC of its own then.
        try:
            deferred = await self._client.release(addr, defer=True)
        except _FAILED as e:
            self.rec.release_errors[_code(e)] += 1
            deferred = False
        if measured and not deferred:
            self.rec.rpcs += 1

    async def _release_later(self, addr: Any, delay_s: float, measured: bool) -> None:
        await asyncio.sleep(delay_s)  # the request's (compressed) execution time
        await self._release(addr, measured)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    async def _begin_measuring(self) -> None:
        """Announce the measured phase (once; concurrent callers wait for it),
        wait for the runner's go-ahead with a handshake, then start the clock."""
        if self._announced:
            await self._measuring.wait()
            return
        self._announced = True
        print(MEASURING, flush=True)
        if self.job.handshake:
            await _go_ahead(HANDSHAKE_S)
        self.rec.start = time.perf_counter()
        self.rec.cpu_start = time.process_time()
        self._measuring.set()

    # -- phases -----------------------------------------------------------

    async def prime(self) -> None:
        """One request per listed function before anything (not measured):
        instances and Dispatch's spec cache exist before the clock starts."""
        if self._client is None or not self.job.prime:
            return
        sem = asyncio.Semaphore(_PRIME_CONCURRENCY)

        async def go(fn: int, hold: float) -> None:
            async with sem:
                try:
                    addr = await self._client.dispatch(self.job.functions[fn])
                except _FAILED as e:
                    self.rec.prime_errors[_code(e)] += 1
                    return
                if hold < 0:
                    self.held.append(addr)
                else:
                    await self._release(addr)

        await asyncio.gather(*(go(f, h) for f, h in self.job.prime))

    async def run_open(self) -> int:
        """Send each request at its time; returns how many were not sent."""
        # perf_counter, not loop.time(): uvloop's clock is the loop
        # iteration's cached millisecond tick, too coarse for latencies.
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter() + 0.05
        tasks: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failed.append(task.exception())  # type: ignore[arg-type]

        async def settle() -> None:
            await asyncio.gather(*tasks)
            if failed:
                raise failed[0]  # a bug in the generator, not a failed call

        for i, (t, fn, hold) in enumerate(self.job.requests):
            measured = i >= self.job.warmup
            if measured and not self._announced:
                await self._begin_measuring()
                # The schedule resumes from here: the snapshot's pause is
                # neither lateness nor a burst of overdue requests.
                t0 = time.perf_counter() - t
                self.rec.start = t0 + t  # the first measured request's due time
            due = t0 + t
            now = await _until(due)
            if now - t0 > self.job.max_duration_s:
                await settle()
                return len(self.job.requests) - i
            if measured:
                self.rec.lag_ms.append(max(0.0, now - due) * 1000.0)
            # Only the requests in flight are kept: a list of every task
            # made would grow the heap that full collections walk.
            task = loop.create_task(self._one(fn, hold, _start(due, now), measured, due))
            tasks.add(task)
            task.add_done_callback(done)
        await settle()
        return 0

    async def run_closed(self) -> int:
        """concurrency workers back to back; returns how many were not sent."""
        it = iter(enumerate(self.job.requests))
        unsent = 0

        async def worker() -> None:
            nonlocal unsent
            for i, (_t, fn, hold) in it:
                measured = i >= self.job.warmup
                if measured:
                    await self._begin_measuring()
                now = time.perf_counter()
                # The time limit counts from the measured phase: connecting
                # and warming up on a busy machine must not use it up.
                start = self.rec.start
                if start is not None and now - start > self.job.max_duration_s:
                    unsent += 1
                    continue
                await self._one(fn, hold, now, measured)

        await asyncio.gather(*(worker() for _ in range(max(1, self.job.concurrency))))
        return unsent

    async def finish(self) -> int:
        """Wait for delayed releases, then release held leases; returns how many."""
        while self._bg:
            await asyncio.gather(*list(self._bg))
        held, self.held = self.held, []
        sem = asyncio.Semaphore(_PRIME_CONCURRENCY)

        async def rel(a: Any) -> None:
            async with sem:
                await self._release(a)

        await asyncio.gather(*(rel(a) for a in held))
        return len(held)

    def result(self, not_sent: int, released_at_end: int) -> dict[str, Any]:
        """The result JSON."""
        r = self.rec
        duration = max(0.0, r.end - r.start) if r.start is not None else 0.0
        return {
            "target": self.job.target,
            "mode": self.job.mode,
            "concurrency": self.job.concurrency,
            "measured": len(r.lat_ms) + sum(r.errors.values()),
            "ok": len(r.lat_ms),
            "errors": dict(r.errors),
            "not_sent": not_sent,
            "duration_s": duration,
            # time.perf_counter() at the measured phase's start (CLOCK_MONOTONIC:
            # comparable with the runner's own timeline on the same machine)
            "started_at": r.start,
            "cpu_s": r.cpu_end - r.cpu_start if r.start is not None else 0.0,
            "rpcs": r.rpcs,
            "t_ms": r.t_ms,
            "lat_ms": r.lat_ms,
            "cold": r.cold,
            "wait_ms": r.wait_ms,
            "lag_ms": r.lag_ms,
            "release_errors": dict(r.release_errors),
            "prime_errors": dict(r.prime_errors),
            "released_at_end": released_at_end,
        }


async def run(job: Job, tune_gc: bool = False) -> dict[str, Any]:
    """Run a job end to end; returns the result JSON. tune_gc: freeze the
    heap and raise the GC thresholds once primed (in a process of its own)."""
    async with LoadGen(job) as g:
        await g.prime()
        if tune_gc:
            # The generator's own collections would add to the latencies it
            # measures: freeze what connecting and priming made, as every
            # server does once ready.
            gctune.tune(GcConfig())
        not_sent = await (g.run_open() if job.mode == "open" else g.run_closed())
        g.rec.cpu_end = time.process_time()
        print(MEASURED, flush=True)
        released = await g.finish()
        return g.result(not_sent, released)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m controlplane.bench.loadgen``."""
    p = argparse.ArgumentParser(description="Galaxy bench load generator")
    p.add_argument("--job", required=True, help="job JSON file")
    p.add_argument("--out", required=True, help="where to write the result JSON")
    args = p.parse_args(argv)
    with open(args.job) as f:
        job = Job.from_dict(json.load(f))
    from controlplane.runtime.host import install_uvloop

    install_uvloop()
    result = asyncio.run(run(job, tune_gc=True))
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
