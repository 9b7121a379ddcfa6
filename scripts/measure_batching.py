"""Adaptive batching on the iris runtime, through a running gateway: the
saturation throughput of a function (closed loop), and open-loop latency at
a given rate; bounded (each phase stops by itself).

    python scripts/measure_batching.py --gateway 127.0.0.1:8080 --function iris \
        --closed 64 --seconds 10
    python scripts/measure_batching.py --gateway 127.0.0.1:8080 --function iris \
        --rate 200 --seconds 10

Prints one JSON line: requests answered per second, p50/p99 in ms (open
loop: from each request's intended send time, so queueing shows), errors.
Each request is one KServe v1 row. Deploy the function twice (with and
without ``batching``, same max_scale) and compare (docs/models.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [0.0] * 99
    return {
        "answered_per_s": round(len(lat) / took, 1),
        "ok": len(lat),
        "errors": len(errors),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", required=True, help="HOST:PORT of the gateway")
    p.add_argument("--function", default="iris")
    p.add_argument("--seconds", type=float, default=10.0)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--closed", type=int, help="closed loop with this many workers")
    mode.add_argument("--rate", type=float, help="open loop at this many requests per second")
    a = p.parse_args()
    if a.seconds > 120:
        p.error("--seconds: at most 120 (a bounded measurement)")
    url = f"http://{a.gateway}/v1/models/{a.function}:predict"
    if a.closed:
        out = asyncio.run(closed(url, a.closed, a.seconds))
    else:
        out = asyncio.run(open_loop(url, a.rate, a.seconds))
    print(json.dumps({"function": a.function, "closed": a.closed, "rate": a.rate, **out}))


if __name__ == "__main__":
    main()
