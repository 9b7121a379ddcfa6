"""What the node's entry costs a warm request (`python -m
controlplane.bench.entry`, as root): one echo instance in a bwrap sandbox
with its own network namespace, and the same keep-alive HTTP/1.1 requests
sent (1) through its door with a lease token and (2) straight into its
namespace (the path the door itself takes), alternating request by request
so that the machine's drift hits both alike. Prints p50/p99 and the
difference as JSON. ``--entry factory`` reaches the namespace through the
sandbox's socket factory (what an agent that is not root uses) instead of
setns; ``--new-connections`` opens a connection per request on both paths
(what a cold connection costs, where the two ways differ)."""

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


async def measure(n: int, entry: str = "setns", new_connections: bool = False) -> dict[str, object]:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--entry", choices=["setns", "factory"], default="setns")
    p.add_argument("--new-connections", action="store_true")
    a = p.parse_args()
    install_uvloop()  # as the node agent runs
    out = asyncio.run(measure(a.requests, a.entry, a.new_connections))
    print(json.dumps(out, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
