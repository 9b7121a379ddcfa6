"""What the node's entry costs a warm request (`python -m
controlplane.bench.entry`, as root): one echo instance in a bwrap sandbox
with its own network namespace, and the same keep-alive HTTP/1.1 requests
sent (1) through its door with a lease token and (2) straight into its
namespace (the path the door itself takes), alternating request by request
so that the machine's drift hits both alike. Prints p50/p99 and the
difference as JSON. ``--entry factory`` reaches the namespace through the
sandbox's socket factory (what an agent that is not root uses) instead of
setns; ``--new-connections`` opens a connection per request on both paths
(what a cold connection costs, where the two ways differ).
``--concurrency C`` sends from C kept connections at once, in blocks of
requests alternating between the two paths, and reports requests/s and
this process's CPU per request on each: the door runs in this process, so
the difference is the door's CPU per request (what costs throughput on a
node whose cores are busy). ``--python-only`` needs no sandbox: it feeds one
gateway-shaped request (a kept connection's, its token already admitted)
to the door's protocol object over and over, with a transport that discards
what it is given, and reports the door's Python time per request."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controlplane.nodeagent.sandbox.bwrap import BwrapBackend
from controlplane.runtime.host import install_uvloop
from controlplane.runtime.leasetoken import HEADER, LeaseKey
from galaxy.v1 import common_pb2

ECHO = Path(__file__).resolve().parents[2] / "examples" / "echo_server.py"


async def _conn(
    host: str, port: int, sock: object = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if sock is None:
        return await asyncio.open_connection(host, port)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))  # type: ignore[arg-type]
    return await asyncio.open_connection(sock=sock)  # type: ignore[arg-type]


async def _one(r: asyncio.StreamReader, w: asyncio.StreamWriter, req: bytes) -> float:
    t0 = time.perf_counter()
    w.write(req)
    head = await r.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )  # fmt: skip
    await r.readexactly(length)
    return time.perf_counter() - t0


async def _block(
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], req: bytes, n: int
) -> None:
    """n requests spread over conns, each connection sending its next
    request when its answer is in."""
    left = n

    async def worker(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await _one(r, w, req)

    await asyncio.gather(*(worker(r, w) for r, w in conns))


async def _concurrent(
    sb: object, req: bytes, n: int, concurrency: int, rounds: int = 5
) -> dict[str, object]:
    """Requests/s and this process's CPU (µs) per request, door vs direct,
    from concurrency connections each; blocks alternate."""
    host, port, dial = sb.host, sb.port, sb.dial  # type: ignore[attr-defined]
    conns = {
        "door": [await _conn(host, port) for _ in range(concurrency)],
        "direct": [await _conn("127.0.0.1", port, await dial()) for _ in range(concurrency)],
    }
    wall: dict[str, float] = {"door": 0.0, "direct": 0.0}
    cpu: dict[str, float] = {"door": 0.0, "direct": 0.0}
    for mode in conns:  # warm-up
        await _block(conns[mode], req, 200)
    block = max(1, n // rounds)
    for i in range(rounds):
        for mode in ("door", "direct") if i % 2 == 0 else ("direct", "door"):
            c0, t0 = time.process_time(), time.perf_counter()
            await _block(conns[mode], req, block)
            wall[mode] += time.perf_counter() - t0
            cpu[mode] += time.process_time() - c0
    for ws in conns.values():
        for _, w in ws:
            w.close()
    total = block * rounds
    out: dict[str, object] = {
        m: {
            "requests_per_s": round(total / wall[m], 1),
            "cpu_us_per_request": round(cpu[m] / total * 1e6, 1),
        }
        for m in conns
    }
    out["door_cpu_us_per_request"] = round((cpu["door"] - cpu["direct"]) / total * 1e6, 1)
    out["door_vs_direct_throughput"] = round(wall["direct"] / wall["door"], 3)
    return out


async def measure(
    n: int, entry: str = "setns", new_connections: bool = False, concurrency: int = 0
) -> dict[str, object]:
    key = LeaseKey(os.urandom(32))
    with tempfile.TemporaryDirectory(prefix="galaxy-bench-entry-") as tmp:
        try:
            b = BwrapBackend(log_dir=Path(tmp) / "logs", lease_key=key, entry=entry)
        except ValueError as e:
            raise SystemExit(f"{e} (setns: run as root)") from None
        spec = common_pb2.FunctionSpec(
            name="echo", command=["python3", str(ECHO)], readiness_path="/healthz"
        )
        sb = await b.start("n", "bench", spec)
        try:
            token = key.sign("bench", time.time_ns() // 1_000_000 + 3_600_000)
            req = (
                f"POST /echo HTTP/1.1\r\nHost: x\r\n{HEADER}: {token}\r\nContent-Length: 1\r\n\r\nx"
            ).encode()
            assert sb.dial is not None
            if concurrency:
                got = await _concurrent(sb, req, n, concurrency)
                return {**got, "requests_per_mode": n, "concurrency": concurrency, "entry": entry}
            door = await _conn(sb.host, sb.port)
            inner = await _conn("127.0.0.1", sb.port, await sb.dial())
            lat: dict[str, list[float]] = {"door": [], "direct": []}
            dial = sb.dial
            for i in range(n + 200):
                for mode, (r, w) in (("door", door), ("direct", inner)):
                    t0 = time.perf_counter()
                    if new_connections:
                        w.close()
                        if mode == "door":
                            r, w = door = await _conn(sb.host, sb.port)
                        else:
                            r, w = inner = await _conn("127.0.0.1", sb.port, await dial())
                    await _one(r, w, req)
                    if i >= 200:  # warm-up
                        lat[mode].append(time.perf_counter() - t0)
            for _, w in (door, inner):
                w.close()
        finally:
            await b.close()

    def q(v: list[float], p: float) -> float:
        return round(statistics.quantiles(v, n=100)[int(p * 100) - 1] * 1000, 3)

    out: dict[str, object] = {
        m: {"p50_ms": q(v, 0.5), "p99_ms": q(v, 0.99)} for m, v in lat.items()
    }
    out["added_p50_ms"] = round(q(lat["door"], 0.5) - q(lat["direct"], 0.5), 3)
    out["requests_per_mode"] = n
    out["entry"] = entry
    out["new_connections"] = new_connections
    return out


class _Discard:
    """Stands in for the transports (not a socket: Python time alone)."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def python_only(n: int) -> dict[str, object]:
    """µs of the door's Python per request (and per answer), no I/O."""
    from controlplane.nodeagent.entry import door

    key = LeaseKey(os.urandom(32))

    async def no_dial() -> object:
        raise OSError("not used")

    d = door.Door("bench", 1, key, no_dial)  # type: ignore[arg-type]
    client = door._Client(d)
    client.connection_made(_Discard())  # type: ignore[arg-type]
    client.up = _Discard()  # type: ignore[assignment]
    upstream = door._Upstream(client)
    token = key.sign("bench", time.time_ns() // 1_000_000 + 3_600_000)
    # What aiohttp (the gateway's client) sends.
    req = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1:40000\r\n{HEADER}: {token}\r\n"
        "Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp\r\n"
        "Content-Length: 1\r\nContent-Type: application/octet-stream\r\n\r\nx"
    ).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"
    t0 = time.perf_counter()
    for _ in range(n):
        client.data_received(req)
    t1 = time.perf_counter()
    for _ in range(n):
        upstream.data_received(answer)
    t2 = time.perf_counter()
    assert client.refused is None, client.refused
    return {
        "request_us": round((t1 - t0) / n * 1e6, 2),
        "answer_us": round((t2 - t1) / n * 1e6, 2),
        "requests": n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--entry", choices=["setns", "factory"], default="setns")
    p.add_argument("--new-connections", action="store_true")
    p.add_argument("--concurrency", type=int, default=0, help="kept connections per path at once")
    p.add_argument("--python-only", action="store_true", help="the door's Python alone, no I/O")
    a = p.parse_args()
    if a.python_only:
        print(json.dumps(python_only(a.requests * 40), indent=2))
        return
    install_uvloop()  # as the node agent runs
    out = asyncio.run(measure(a.requests, a.entry, a.new_connections, a.concurrency))
    print(json.dumps(out, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
