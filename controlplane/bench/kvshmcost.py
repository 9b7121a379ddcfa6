"""What a same-node KV move costs in CPU: shared memory (``kvshm``: a memfd
handed over a Unix socket) against HTTP over a Unix socket (``kvwire``),
and the node's KV relay that a sandboxed sender goes through
(``nodeagent.entry.kvrelay``): the memfd handed to the relay and passed on
(the same-node way), or its pages PUT by the relay over TCP (the way to
another node's entry, here to a receiver on loopback).

    python -m controlplane.bench.kvshmcost --sizes-mb 4,16,64,256 --trials 5

Sender and receiver run in this one process (one event loop, the receiver's
inbox and both listeners real), so its CPU time is the whole move's work:
writing the cache, the kernel's copies, reading it into the inbox. CPU
seconds, not wall time, because on a shared machine a move's wall time is
mostly waiting for a core (``kvtransfer`` measures wall time between two
processes; its same-node rows moved by 10x between runs here). The cache is
real random bytes (as a prefill instance's), fresh for each move.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from controlplane.llm import kvsend, kvshm, kvwire
from controlplane.nodeagent.entry.kvrelay import KvRelay
from controlplane.nodeagent.entry.kvroute import KvRoutes, Member
from controlplane.runtime import kvmove
from controlplane.runtime.kvaddr import local_target, shm_target, unix_path

MIB = 1 << 20
_DECODE = "bench-decode"  # the instance a relayed cache goes to (no lease here)


#: a path: the target, and the relay socket the sender goes through ("": none)
Way = tuple[str, str]


async def _move(way: Way, inbox: kvwire.KvInbox, data: bytes) -> tuple[float, float]:
    """(CPU s, wall s) of one move, the cache taken out after."""
    target, relay = way
    kv_id = uuid.uuid4().hex[:16]
    c0, w0 = time.process_time(), time.perf_counter()
    await kvsend.send(target, kv_id, len(data), 1, data=data, instance=_DECODE, relay=relay)
    entry = kvwire.claim(inbox, kv_id)
    took = time.process_time() - c0, time.perf_counter() - w0
    if len(entry.data) != len(data) or entry.data[-64:] != data[-64:]:
        raise RuntimeError(f"{target}: the cache arrived changed")
    return took


async def run(sizes_mb: list[int], trials: int) -> list[dict[str, Any]]:
    """Every size on both paths, alternating, ``trials`` times."""
    name = f"bench-shm-{os.getpid()}"
    inbox = kvwire.KvInbox(2 * max(sizes_mb) * MIB + MIB)
    app = web.Application()
    app.router.add_put("/v1/kv/{kv_id}", kvwire.receiver(inbox))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, unix_path(local_target(name))).start()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = runner.addresses[-1][1]
    sock = await kvshm.listen(inbox, shm_target(name))
    work = Path(tempfile.mkdtemp(prefix="galaxy-bench-kvrelay-"))
    relay = KvRelay(KvRoutes(None, (1024, 65536), lambda: time.time_ns() // 1_000_000))
    relay.prepare(work / "pre", None)
    relay.prepare(work / "dec", None)
    relay.open(Member("pre", "", "pre", "", "127.0.0.1:1"), work / "pre", None)
    relay.open(Member(name, "", "dec", "pre", "127.0.0.1:2"), work / "dec", kvmove.seqpacket)
    via = str(work / "pre" / "kv.sock")
    paths: dict[str, Way] = {
        "Unix socket (HTTP)": (local_target(name), ""),
        "shared memory": (shm_target(name), ""),
        "KV relay, descriptor passed on": (shm_target(name), via),
        "KV relay, PUT over TCP": (f"http://127.0.0.1:{port}", via),
    }
    rows: list[dict[str, Any]] = []
    try:
        for mb in sizes_mb:
            got: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
            for _ in range(trials):
                data = os.urandom(mb * MIB)
                for path, way in paths.items():
                    got[path].append(await _move(way, inbox, data))
            for path, runs in got.items():
                rows.append({
                    "path": path, "mib": mb,
                    "cpu_s": statistics.median(c for c, _ in runs),
                    "wall_s": statistics.median(w for _, w in runs),
                })  # fmt: skip
    finally:
        await relay.close_all()
        shutil.rmtree(work, ignore_errors=True)
        kvshm.stop(sock)
        await runner.cleanup()
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: CPU and wall per move, and shared memory's CPU ratio."""
    lines = ["| MiB | path | CPU s (median) | wall s (median) | CPU vs Unix socket |",
             "|---|---|---|---|---|"]  # fmt: skip
    base = {r["mib"]: r["cpu_s"] for r in rows if r["path"].startswith("Unix")}
    for r in rows:
        ratio = r["cpu_s"] / base[r["mib"]] if base[r["mib"]] else float("nan")
        lines.append(f"| {r['mib']} | {r['path']} | {r['cpu_s']:.4f} | {r['wall_s']:.4f} | "
                     f"{ratio:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", default="4,16,64,256")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes_mb.split(",")]
    except ValueError:
        p.error("--sizes-mb: comma-separated whole MiB")
    if not sizes or min(sizes) < 1 or max(sizes) > 1024 or not 1 <= a.trials <= 100:
        p.error("--sizes-mb each 1..1024, --trials 1..100")
    rows = asyncio.run(run(sizes, a.trials))
    print(render(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
