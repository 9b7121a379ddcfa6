"""What scraping load signals costs the router: CPU seconds of this process
per scraped instance per second, at a scrape interval, against real emulated
servers in subprocesses (so their own CPU is not counted).

    python -m controlplane.llm.scrapecost --instances 8 --interval-ms 100 --seconds 5

Prints the CPU per scrape (fetch + parse) and the resulting CPU fraction per
instance per second (cost x scrapes per second).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp

from controlplane.runtime.llmsignals import SignalError, scrape


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _measure(urls: list[str], interval: float, seconds: float) -> tuple[int, float]:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 20.0
        for u in urls:  # wait for every server to answer
            while True:
                try:
                    await scrape(session, u)
                    break
                except SignalError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        n, cpu0, end = 0, time.process_time(), time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            got = await asyncio.gather(
                *(scrape(session, u, timeout_s=2.0) for u in urls), return_exceptions=True
            )
            n += sum(1 for g in got if not isinstance(g, BaseException))
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - tick)))
        return n, time.process_time() - cpu0


def main(argv: list[str] | None = None) -> int:
    """Start the servers, scrape them for a while, print the cost."""
    ap = argparse.ArgumentParser(prog="python -m controlplane.llm.scrapecost", description=__doc__)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--profile", default="llama2-13b-a100")
    a = ap.parse_args(argv)
    if not (1 <= a.instances <= 64 and a.interval_ms > 0 and 0 < a.seconds <= 60):
        ap.error("--instances 1-64, --interval-ms > 0, --seconds in (0, 60]")
    ports = [_free_port() for _ in range(a.instances)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "controlplane.llm.server", "--profile", a.profile],
            env={**os.environ, "HOST": "127.0.0.1", "PORT": str(p)},
            stdout=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
        n, cpu = asyncio.run(_measure(urls, a.interval_ms / 1000, a.seconds))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
    per_scrape = cpu / n
    per_instance_s = per_scrape * 1000.0 / a.interval_ms
    print(
        f"{n} scrapes of {a.instances} instances every {a.interval_ms:.0f} ms: "
        f"{per_scrape * 1e6:.0f} us CPU per scrape, "
        f"{per_instance_s * 100:.2f}% of a core per instance"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
