"""What one hop's wake-ups cost on this machine (`python -m
controlplane.bench.wakeups`): two processes exchange a small request and
answer over a connected socket pair, one round trip at a time, as a proxy
and the server behind it do at concurrency 1; over TCP on loopback and over
a Unix socket, with the two processes pinned to the same CPU and to two
different CPUs. Reports, per kind and placement, the round trip's time and
the CPU both processes spent on it (µs). Every hop a request takes costs at
least one such round trip; on a virtual machine a wake-up on another CPU
also costs the interrupt that wakes it, which the two placements show apart.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

# The answering side: echoes 4 times what it reads until the socket closes,
# then prints the CPU it spent after its first answer (its start excluded).
_ECHO = (
    "import os, socket, sys\n"
    "os.sched_setaffinity(0, {int(sys.argv[2])})\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "s.sendall(s.recv(65536) * 4)\n"
    "t = os.times()\n"
    "while (d := s.recv(65536)):\n"
    "    s.sendall(d * 4)\n"
    "u = os.times()\n"
    "print(u.user + u.system - t.user - t.system)\n"
)


def _pair(kind: str) -> tuple[socket.socket, socket.socket]:
    if kind == "unix":
        return socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def round_trips(kind: str, cpus: tuple[int, int], n: int, size: int) -> dict[str, float]:
    """n round trips of size bytes out, 4x size back; this process on
    cpus[0], the answering one on cpus[1]."""
    a, b = _pair(kind)
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _ECHO, str(b.fileno()), str(cpus[1])],
        pass_fds=[b.fileno()],
        stdout=subprocess.PIPE,
    )
    b.close()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    try:
        msg, want = b"x" * size, 4 * size
        a.sendall(msg)  # the child is up once it has answered one
        got = 0
        while got < want:
            got += len(a.recv(65536))
        t0, c0 = time.perf_counter(), os.times()
        for _ in range(n):
            a.sendall(msg)
            got = 0
            while got < want:
                got += len(a.recv(65536))
        wall = time.perf_counter() - t0
        c1 = os.times()
        a.close()
        out, _ = child.communicate(timeout=30)
    finally:
        os.sched_setaffinity(0, before)
        if child.poll() is None:
            child.kill()
            child.wait()
    cpu = c1.user + c1.system - c0.user - c0.system + float(out)
    return {"round_trip_us": round(wall / n * 1e6, 1), "cpu_us": round(cpu / n * 1e6, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m controlplane.bench.wakeups", description=__doc__)
    ap.add_argument("--round-trips", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=200, help="request bytes (the answer is 4x)")
    ap.add_argument("--rounds", type=int, default=2, help="each placement alternates this often")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if args.round_trips < 1 or args.size < 1:
        ap.error("--round-trips and --size must be at least 1")
    placements = {"same_cpu": (cpus[0], cpus[0])}
    if len(cpus) > 1:
        placements["other_cpu"] = (cpus[0], cpus[1])
    out: dict[str, dict[str, list[dict[str, float]]]] = {}
    for _ in range(args.rounds):
        for kind in ("tcp", "unix"):
            for name, pin in placements.items():
                got = round_trips(kind, pin, args.round_trips, args.size)
                out.setdefault(kind, {}).setdefault(name, []).append(got)
    print(json.dumps({"round_trips": args.round_trips, "size": args.size, "runs": out}, indent=2))


if __name__ == "__main__":
    main()
