"""What the kernel adds to short work in a process that is already running.

``python -m simulator.calibrate_preempt`` measures it on this machine, for
the host model (``simulator.host``): a worker process, an asyncio loop like
every Galaxy process, is woken by a message every ``gap`` seconds and then
runs a busy period of ``spans`` back-to-back pieces of pure-Python work of
~15 us each (a capacity credit's ``take`` is ~14 us), timing each piece with
``perf_counter`` as Dispatch times its ``take``. Meanwhile ``hogs``
CPU-bound processes compete for the cores. Per piece it records how long it
took and how far into its busy period (CPU time since the wake) it started;
the summary gives, by that position, the share of pieces stretched past
100 us (the kernel took the core away mid-piece) and their mean stretch.

The host model's question is whether a stretch is as likely for every
piece (a slice boundary falling inside it with probability work / slice)
or only once the process has run a full slice since it woke (EEVDF gives a
waking task a fresh slice; it is preempted when it has used it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import socket
import statistics
import time
from typing import Any

#: A piece stretched past this was preempted (its work is ~15 us).
STRETCHED_S = 100e-6
#: Quantiles of the pieces' durations reported.
QUANTILES = (50, 87, 90, 95, 99, 99.9)
#: Points of the pieces' distribution (each / the median) kept as its shape.
SHAPE_POINTS = 200
#: Positions in the busy period (CPU seconds since the wake), bin edges.
POSITION_EDGES = (0.0, 0.001, 0.002, 0.004, 0.008, float("inf"))


def _work(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i
    return x


def loops_for(span_s: float) -> int:
    """Iterations of ``_work`` that take ``span_s`` on a free core (the
    fastest of several timings: contention only lengthens one)."""
    n = 1000
    best = min(_timed(n) for _ in range(50))
    return max(1, round(n * span_s / best))


def _timed(n: int) -> float:
    t0 = time.perf_counter()
    _work(n)
    return time.perf_counter() - t0


def _hog(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        _work(10_000)


def _sender(sock: socket.socket, gap_s: float, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        time.sleep(gap_s)
        sock.send(b"x")
    sock.send(b"q")


def _worker(sock: socket.socket, spans: int, n: int, span_s: float, out: Any) -> None:
    # (position: CPU seconds of work since the wake, duration s)
    rows: list[tuple[float, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_message() -> None:
            data = sock.recv(4096)
            if b"q" in data:
                loop.remove_reader(sock.fileno())
                done.set_result(None)
                return
            for i in range(spans):
                t0 = time.perf_counter()
                _work(n)
                rows.append((i * span_s, time.perf_counter() - t0))

        loop.add_reader(sock.fileno(), on_message)
        await done

    asyncio.run(main())
    out.send(rows)


def _grpc_worker(n: int, seconds: float, ports: Any, out: Any) -> None:
    """A grpc.aio server on uvloop, as a Galaxy process: each call's handler
    runs one timed piece (its threads and its loop are what surround a
    take in Dispatch)."""
    import grpc
    import uvloop

    rows: list[tuple[float, float]] = []

    async def handle(request: bytes, context: Any) -> bytes:
        t0 = time.perf_counter()
        _work(n)
        rows.append((0.0, time.perf_counter() - t0))
        return request

    async def main() -> None:
        server = grpc.aio.server()
        h = grpc.method_handlers_generic_handler(
            "m.P", {"P": grpc.unary_unary_rpc_method_handler(handle)}
        )
        server.add_generic_rpc_handlers((h,))
        ports.send(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await asyncio.sleep(seconds + 1.0)
        await server.stop(0)

    uvloop.run(main())
    out.send(rows)


def _grpc_client(port: int, rate: float, seconds: float) -> None:
    """Calls at ``rate`` per second (Poisson), each on its own task."""
    import random

    import grpc

    async def main() -> None:
        rng = random.Random(1)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/m.P/P")
            await call(b"x")
            tasks = set()
            stop_at = time.monotonic() + seconds
            while time.monotonic() < stop_at:
                await asyncio.sleep(rng.expovariate(rate))
                t = asyncio.ensure_future(call(b"x", timeout=5.0))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def measure_grpc(rate: float, hogs: int, seconds: float = 10.0,
                 span_s: float = 15e-6) -> dict[str, Any]:  # fmt: skip
    """Pieces in the handlers of a grpc.aio server called ``rate`` times a
    second: their distribution (quantiles and shape)."""
    n = loops_for(span_s)
    ctx = mp.get_context("fork")
    rx, tx = ctx.Pipe(duplex=False)
    prx, ptx = ctx.Pipe(duplex=False)
    stop_at = time.monotonic() + seconds + 1.0
    worker = ctx.Process(target=_grpc_worker, args=(n, seconds, ptx, tx))
    worker.start()
    port = prx.recv()
    procs = [ctx.Process(target=_hog, args=(stop_at,)) for _ in range(hogs)]
    procs.append(ctx.Process(target=_grpc_client, args=(port, rate, seconds)))
    for p in procs:
        p.start()
    rows: list[tuple[float, float]] = rx.recv()
    for p in [*procs, worker]:
        p.join()
    return {"grpc_rate": rate, "hogs": hogs, **_distribution(rows)}


def _distribution(rows: list[tuple[float, float]]) -> dict[str, Any]:
    ds = sorted(d for _, d in rows)
    base = ds[len(ds) // 2]
    q = {f"p{x:g}_us": ds[min(len(ds) - 1, int(len(ds) * x / 100))] * 1e6 for x in QUANTILES}
    shape = [ds[min(len(ds) - 1, int(len(ds) * (i + 0.5) / SHAPE_POINTS))] / base
             for i in range(SHAPE_POINTS)]  # fmt: skip
    return {"piece_median_us": base * 1e6, "pieces": len(ds), "piece_quantiles": q,
            "shape": shape, "loadavg": os.getloadavg()}  # fmt: skip


def measure(spans: int, hogs: int, seconds: float = 3.0, span_s: float = 15e-6) -> dict[str, Any]:
    """One configuration: the pieces' stretch by position in the busy period
    (each wake 3x the busy period after the last, at least 2 ms, so the
    worker sleeps in between)."""
    n = loops_for(span_s)
    gap_s = max(0.002, 3 * spans * span_s)
    ctx = mp.get_context("fork")
    a, b = socket.socketpair()
    stop_at = time.monotonic() + seconds
    rx, tx = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_hog, args=(stop_at,)) for _ in range(hogs)]
    procs.append(ctx.Process(target=_worker, args=(b, spans, n, span_s, tx)))
    procs.append(ctx.Process(target=_sender, args=(a, gap_s, stop_at)))
    for p in procs:
        p.start()
    rows: list[tuple[float, float]] = rx.recv()
    for p in procs:
        p.join()
    base = statistics.median(d for _, d in rows)
    bins = []
    for lo, hi in itertools.pairwise(POSITION_EDGES):
        ds = [d for p, d in rows if lo <= p < hi]
        long = [d for d in ds if d > STRETCHED_S]
        bins.append({
            "from_ms": lo * 1e3, "to_ms": hi * 1e3, "pieces": len(ds),
            "stretched_share": len(long) / len(ds) if ds else None,
            "stretch_mean_ms": (statistics.mean(long) - base) * 1e3 if long else None,
            "per_slice_model": None,
        })  # fmt: skip
    return {"spans": spans, "hogs": hogs, "gap_ms": gap_s * 1e3, **_distribution(rows),
            "by_position": bins}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Measure every configuration and print one JSON document."""
    ap = argparse.ArgumentParser(prog="python -m simulator.calibrate_preempt")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--spans", type=int, nargs="+", default=[1, 20, 400])
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--grpc-rate", type=float, nargs="*", default=[],
                    help="instead: pieces in grpc.aio handlers at these call rates")  # fmt: skip
    a = ap.parse_args(argv)
    if a.grpc_rate:
        res = [measure_grpc(r, h, seconds=a.seconds) for h in a.hogs for r in a.grpc_rate]
    else:
        res = [measure(s, h, seconds=a.seconds) for h in a.hogs for s in a.spans]
    print(json.dumps({"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "cpus": os.cpu_count(), "runs": res}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
