"""Load on a KServe v1 function through the gateway, for the batching bench
(``controlplane.bench.batching``) and ``scripts/measure_batching.py``: a
closed loop (saturation: answered per second) and an open loop at a rate
(latency from each request's intended send time, so queueing shows). Each
request is one iris row. Bounded: each phase stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator

import aiohttp

ROW = [6.8, 2.8, 4.8, 1.4]
#: Requests in flight at most (open loop): a bound on the generator's memory.
MAX_IN_FLIGHT = 4096
#: Connections the open loop keeps to the gateway.
CONNECTIONS = 128


async def one(http: aiohttp.ClientSession, url: str, t0: float, lat: list[float],
              errors: list[str]) -> None:  # fmt: skip
    """One request; its latency from t0 into lat, or its error."""
    try:
        async with http.post(url, json={"instances": [ROW]}) as r:
            await r.read()
            if r.status != 200:
                errors.append(str(r.status))
                return
    except (aiohttp.ClientError, TimeoutError) as e:
        errors.append(type(e).__name__)
        return
    lat.append(time.perf_counter() - t0)


@contextlib.asynccontextmanager
async def warmed(url: str, connections: int) -> AsyncIterator[aiohttp.ClientSession]:
    """A session of at most ``connections`` kept connections (as a client
    pool: opening one per request would measure handshakes), after one
    request that starts the instance."""
    conn = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), connector=conn) as h:
        await one(h, url, time.perf_counter(), [], [])
        yield h


async def closed(url: str, workers: int, seconds: float) -> dict[str, float]:
    """``workers`` callers, each sending its next request when answered."""
    lat: list[float] = []
    errors: list[str] = []
    async with warmed(url, workers) as http:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < end:
                await one(http, url, time.perf_counter(), lat, errors)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        took = time.perf_counter() - t0
    return summary(lat, errors, took)


async def open_loop(url: str, rate: float, seconds: float) -> dict[str, float]:
    """Requests leave at ``rate`` per second whatever the answers do."""
    lat: list[float] = []
    errors: list[str] = []
    async with warmed(url, CONNECTIONS) as http:
        n = int(rate * seconds)
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule, not a synchronisation
            if len(tasks) >= MAX_IN_FLIGHT:
                errors.append("generator-full")
                continue
            t = asyncio.create_task(one(http, url, due, lat, errors))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        took = time.perf_counter() - start
    return summary(lat, errors, took)


def summary(lat: list[float], errors: list[str], took: float) -> dict[str, float]:
    """Answered per second, counts and p50/p99 in ms."""
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [0.0] * 99
    return {
        "answered_per_s": round(len(lat) / took, 1),
        "ok": len(lat),
        "errors": len(errors),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
    }
