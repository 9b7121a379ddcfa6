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
import json

from controlplane.bench.batchload import closed, open_loop


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
