"""What the node's entry costs by itself (`python -m
controlplane.bench.relayfloor`): the stdlib echo example (examples/
echo_server.py) called at concurrency 1 straight and through a ``Door``
(``nodeagent/entry/door.py``) running alone in a process of its own, with
no lease key, no sandbox, no gateway and no node agent around it. Two
clients: a blocking raw socket (the least a caller can cost) and aiohttp's
client (the gateway's). Rounds alternate the order of the two paths; the
report gives, per client, the medians over rounds of the time per request
straight and through the door, their difference, and the door process's
CPU per request (from its ``/proc`` ticks). This is the floor a relay in
user space sets on this machine, apart from what the rest of a cluster
adds (``controlplane.bench.gateway_ab`` measures the whole path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from controlplane.launch.etcd import free_port

ECHO = Path(__file__).resolve().parents[2] / "examples" / "echo_server.py"
REQUEST = b"POST /relayfloor HTTP/1.1\r\nHost: bench\r\nContent-Length: 5\r\n\r\nhello"
#: Requests per round before timing starts (connections and caches warm).
WARMUP = 200
CLIENTS = ("raw", "aiohttp")


def _serve_door(upstream_port: int) -> None:
    """Run a Door to 127.0.0.1:upstream_port until stdin closes; print its
    address once it listens."""
    from controlplane.nodeagent.entry.door import Door
    from controlplane.runtime.host import install_uvloop

    install_uvloop()

    async def dial() -> socket.socket:
        s = socket.socket()
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    async def main() -> None:
        door = Door("relayfloor", upstream_port, None, dial)
        port = free_port()
        await door.open("127.0.0.1", port)
        print(json.dumps({"port": port}), flush=True)
        # The parent's end of stdin is the lifeline: its close ends the door.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        await door.close()

    asyncio.run(main())


def _raw(port: int, n: int) -> float:
    """Mean µs per request of n keep-alive requests from a blocking socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one() -> None:
            s.sendall(REQUEST)
            buf = b""
            while b"\r\n\r\n" not in buf:
                got = s.recv(65536)
                if not got:
                    raise ConnectionError("the server closed the connection")
                buf += got
            head, _, body = buf.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"answer: {head[:80]!r}")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += s.recv(65536)

        for _ in range(WARMUP):
            one()
        t0 = time.perf_counter()
        for _ in range(n):
            one()
        return (time.perf_counter() - t0) / n * 1e6


async def _aiohttp(port: int, n: int) -> float:
    """Mean µs per request of n requests from aiohttp's client (one connection)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/relayfloor"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:

        async def one() -> None:
            async with session.post(url, data=b"hello") as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"answer: {r.status}")

        for _ in range(WARMUP):
            await one()
        t0 = time.perf_counter()
        for _ in range(n):
            await one()
        return (time.perf_counter() - t0) / n * 1e6


def _ready(port: int, proc: subprocess.Popen[bytes], within_s: float = 15.0) -> None:
    """Wait until the echo answers on port (it prints nothing when ready)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the echo server exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)  # a process that says nothing: its port is the signal
    raise RuntimeError("the echo server did not listen in time")


def run(requests: int, rounds: int, clients: tuple[str, ...] = CLIENTS) -> dict[str, object]:
    """The measurement (see the module docstring)."""
    from controlplane.bench.gateway import process_cpu_ns
    from controlplane.runtime.host import install_uvloop

    install_uvloop()  # the aiohttp client's loop, as in the gateway
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port)}
    echo = subprocess.Popen([sys.executable, str(ECHO)], env=env, stdin=subprocess.DEVNULL)
    door: subprocess.Popen[bytes] | None = None
    try:
        _ready(port, echo)
        door = subprocess.Popen(
            [sys.executable, "-m", "controlplane.bench.relayfloor", "--serve-door", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert door.stdout is not None
        line = door.stdout.readline()
        if not line:
            raise RuntimeError("the door did not start")
        door_port = int(json.loads(line)["port"])
        out: dict[str, object] = {"requests": requests, "rounds": rounds}
        for kind in clients:
            times: dict[str, list[float]] = {"direct": [], "door": []}
            cpu = 0.0
            for r in range(rounds):
                order = ("direct", "door") if r % 2 == 0 else ("door", "direct")
                for path in order:
                    p = port if path == "direct" else door_port
                    before = process_cpu_ns(door.pid)
                    us = _raw(p, requests) if kind == "raw" else asyncio.run(_aiohttp(p, requests))
                    if path == "door":
                        cpu += (process_cpu_ns(door.pid) - before) / 1e9
                    times[path].append(us)
            direct, through = statistics.median(times["direct"]), statistics.median(times["door"])
            out[kind] = {
                "direct_us": round(direct, 1),
                "door_us": round(through, 1),
                "added_us": round(through - direct, 1),
                "door_cpu_us_per_request": round(cpu / (rounds * (requests + WARMUP)) * 1e6, 1),
                "rounds_us": {k: [round(x, 1) for x in v] for k, v in times.items()},
            }
        return out
    finally:
        if door is not None:
            if door.stdin is not None:
                door.stdin.close()
            try:
                door.wait(timeout=10)
            except subprocess.TimeoutExpired:
                door.kill()
                door.wait()
        echo.terminate()
        try:
            echo.wait(timeout=10)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m controlplane.bench.relayfloor", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--requests", type=int, default=4000, help="timed requests per round and path")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--clients", default=",".join(CLIENTS), help="raw and/or aiohttp")
    p.add_argument("--serve-door", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_door is not None:
        _serve_door(args.serve_door)
        return
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be at least 1")
    clients = tuple(c for c in args.clients.split(",") if c)
    bad = [c for c in clients if c not in CLIENTS]
    if bad or not clients:
        p.error(f"--clients: raw and/or aiohttp, got {args.clients[:40]!r}")
    print(json.dumps(run(args.requests, args.rounds, clients), indent=2))


if __name__ == "__main__":
    main()
