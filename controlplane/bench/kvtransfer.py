"""The KV-transfer bench: how long moving a KV cache from a prefill instance
to a decode instance takes on each path placement can choose, beside the
floor of that path (bytes / the path's own measured throughput).

    python -m controlplane.bench.kvtransfer --sizes-mb 4,16,64,256 --rate-mbit 1000

Paths: the same node over the decode instance's Unix socket, through shared
memory (a memfd passed over its Unix socket, ``kvshm``; its floor is the Unix
socket's raw stream, the copy it saves) and over TCP on loopback; another
host (a network namespace behind a veth) unshaped and shaped to
``--rate-mbit`` with ``tc``, each directly and through the node's KV relay
(``nodeagent.entry.kvrelay``, in this process: the memfd handed to it over
its socket, its pages PUT to the other host), the way a prefill instance in
a bubblewrap sandbox sends. The receiver is the emulated LLM
server in decode role (``--kv-unix``), a process of its own, so sender and
receiver do not share an event loop. Each transfer is a real ``PUT
/v1/kv/ID`` of the given size (``kvsend.send``), deleted after it lands. The
floor of a path is measured in the same run with a plain socket stream (no
HTTP) of the largest size into a process that discards it. The RDMA-class
link exists only in the simulator (``disagg.LINKS['rdma-sim']``) and is not
measured. Needs root for the namespaces; prints a table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlplane.bench.shapedlink import ShapedHost
from controlplane.llm import kvsend
from controlplane.nodeagent.entry.kvrelay import KvRelay
from controlplane.nodeagent.entry.kvroute import KvRoutes, Member
from controlplane.runtime.kvaddr import shm_target

MIB = 1 << 20
PORT = 8300
SINK_PORT = 8301
#: the decode instance's id: names its abstract sockets (kvaddr)
INSTANCE = f"bench-kv-{os.getpid()}"
REPO = Path(__file__).resolve().parents[2]

#: A process that accepts one connection at a time on a TCP port or a Unix
#: socket, reads everything to EOF, and answers the byte count.
_SINK = """
import os, socket, sys
kind, where = sys.argv[1], sys.argv[2]
if kind == "unix":
    s = socket.socket(socket.AF_UNIX); s.bind(where)
else:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    host, port = where.rsplit(":", 1); s.bind((host, int(port)))
s.listen(4); print("ready", flush=True)
while True:
    c, _ = s.accept(); n = 0
    while b := c.recv(1 << 20): n += len(b)
    c.sendall(str(n).encode()); c.close()
"""


@dataclass
class Path_:
    """One way to the decode instance."""

    name: str
    #: kvwire target: http://HOST:PORT or unix:/path
    target: str
    #: where the raw sink listens: ("tcp", "HOST:PORT") or ("unix", path)
    sink: tuple[str, str]
    #: the decode instance's HTTP base, where a landed cache is deleted
    http: str
    #: the node's KV relay socket the sender goes through ("": none), as a
    #: sender in a bubblewrap sandbox does
    relay: str = ""


def _spawn(prefix: tuple[str, ...], argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, sys.executable, *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip


def _await_line(p: subprocess.Popen[str], word: str) -> None:
    assert p.stdout is not None
    line = p.stdout.readline()
    if word not in line:
        raise RuntimeError(f"a bench process did not start (exit {p.poll()})")


def _await_http(url: str, p: subprocess.Popen[Any], within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while True:  # an external process: poll its health route
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the decode instance at {url} did not start") from None
            time.sleep(0.05)


@contextlib.contextmanager
def _host(
    prefix: tuple[str, ...], ip: str, inbox_mb: int, unix: str | None,
    server: tuple[str, ...] = ("-m", "controlplane.llm.server"),
) -> Iterator[list[subprocess.Popen[str]]]:  # fmt: skip
    """A decode instance (``server``: its module and arguments; the emulated
    server by default) and a raw sink on one host (prefix: its namespace)."""
    # Its abstract sockets (same-node HTTP and shared memory) are named for it.
    env = dict(os.environ, HOST=ip, PORT=str(PORT), GALAXY_INSTANCE_ID=INSTANCE)
    procs: list[subprocess.Popen[str]] = []
    try:
        argv = [*server, "--kv-inbox-mb", str(inbox_mb)]
        if unix:
            argv += ["--kv-unix", unix + ".kv"]
        server_proc = _spawn(prefix, argv, env)
        procs.append(server_proc)
        for kind, where in [("tcp", f"{ip}:{SINK_PORT}")] + ([("unix", unix)] if unix else []):
            sink = _spawn(prefix, ["-c", _SINK, kind, where], env)
            procs.append(sink)
            _await_line(sink, "ready")
        _await_http(f"http://{ip}:{PORT}", server_proc, within_s=300)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _raw_throughput(sink: tuple[str, str], nbytes: int) -> float:
    """bytes/s of a plain socket stream of nbytes into the sink."""
    kind, where = sink
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.connect(where)
    else:
        host, port = where.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=30)
    block = b"\x5a" * MIB
    t0 = time.perf_counter()
    with s:
        left = nbytes
        while left > 0:
            left -= s.send(block[: min(left, MIB)])
        s.shutdown(socket.SHUT_WR)
        got = int(s.recv(64))
    took = time.perf_counter() - t0
    if got != nbytes:
        raise RuntimeError(f"the sink got {got} of {nbytes} bytes")
    return nbytes / took


async def _send_once(path: Path_, nbytes: int) -> float:
    kv_id = uuid.uuid4().hex[:16]
    took = await kvsend.send(path.target, kv_id, nbytes, tokens=1, instance=INSTANCE,
                             relay=path.relay)  # fmt: skip
    # Give the room back (the inbox holds caches for their decode request).
    await asyncio.to_thread(delete, f"{path.http}/v1/kv/{kv_id}")
    return took


def delete(url: str) -> None:
    """DELETE a landed cache (``.../v1/kv/ID``): its room back."""
    urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()


async def _measure(paths: list[Path_], sizes: list[int], trials: int) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        bw = statistics.median(_raw_throughput(path.sink, max(sizes)) for _ in range(trials))
        for size in sizes:
            times = [await _send_once(path, size) for _ in range(trials)]
            med = statistics.median(times)
            floor = size / bw
            rows.append({"path": path.name, "bytes": size, "seconds": med, "trials": times,
                         "floor_seconds": floor, "x_floor": med / floor,
                         "path_bytes_per_s": bw})  # fmt: skip
    return rows


async def run(sizes_mb: list[int], rate_mbit: float, trials: int) -> dict[str, Any]:
    """Measure every path; the report (see the module docstring)."""
    sizes = [m * MIB for m in sizes_mb]
    inbox = 2 * max(sizes_mb) + 16
    work = Path(tempfile.mkdtemp(prefix="galaxy-bench-kv-"))
    rows: list[dict[str, Any]] = []
    relay = KvRelay(KvRoutes(None, (1024, 65536), lambda: time.time_ns() // 1_000_000))
    try:
        unix = str(work / "sink.sock")
        with _host((), "127.0.0.1", inbox, unix):
            http = f"http://127.0.0.1:{PORT}"
            local = [
                Path_("same node, Unix socket", f"unix:{unix}.kv", ("unix", unix), http),
                # Against the Unix socket's raw stream: what it replaces.
                Path_("same node, shared memory", shm_target(INSTANCE), ("unix", unix), http),
                Path_("same node, TCP loopback", http, ("tcp", f"127.0.0.1:{SINK_PORT}"), http),
            ]
            rows += await _measure(local, sizes, trials)
        via = _relay(relay, work)
        for rate in (None, rate_mbit):
            with (
                ShapedHost(rate, prefix="galaxy-kv") as host,
                _host(host.exec_prefix, host.host_ip, inbox, None),
            ):
                name = "other host, veth" + ("" if rate is None else f" shaped {rate:g} Mbit/s")
                http = f"http://{host.host_ip}:{PORT}"
                far = Path_(name, http, ("tcp", f"{host.host_ip}:{SINK_PORT}"), http)
                rows += await _measure([far, replace(far, name=f"{name}, KV relay", relay=via)],
                                       sizes, trials)  # fmt: skip
    finally:
        await relay.close_all()
        shutil.rmtree(work, ignore_errors=True)
    return {"rate_mbit": rate_mbit, "trials": trials, "rows": rows}


def _relay(relay: KvRelay, work: Path) -> str:
    """The relay socket of a sender on this node (the bench process is its
    node agent): the path a sandboxed prefill instance takes to another node."""
    relay.prepare(work / "relay", None)
    relay.open(Member("bench-prefill", "", "pre", "", "127.0.0.1:1"), work / "relay", None)
    return str(work / "relay" / "kv.sock")


def render(r: dict[str, Any]) -> str:
    """The report as a table (also ``kvreal``'s, whose rows add the
    prompt's tokens)."""
    tokens = any("prompt_tokens" in row for row in r["rows"])
    w = max([38, *(len(row["path"]) for row in r["rows"])])
    lines = [f"{'path':<{w}} {'tokens':>6} " if tokens else f"{'path':<{w}} "]
    lines[0] += f"{'MiB':>6} {'seconds':>9} {'floor s':>9} {'x floor':>8} {'path MB/s':>10}"
    for row in r["rows"]:
        head = f"{row['path']:<{w}} "
        if tokens:
            head += f"{row['prompt_tokens']:>6} "
        lines.append(
            f"{head}{row['bytes'] / MIB:>6.1f} {row['seconds']:>9.4f} "
            f"{row['floor_seconds']:>9.4f} {row['x_floor']:>8.2f} "
            f"{row['path_bytes_per_s'] / 1e6:>10.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m controlplane.bench.kvtransfer``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", default="4,16,64,256", help="cache sizes, MiB, comma-separated")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="the shaped link's rate")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes_mb.split(",")]
    except ValueError:
        p.error("--sizes-mb: comma-separated whole MiB, e.g. 4,16,64")
    if not sizes or min(sizes) < 1 or max(sizes) > 4096:
        p.error("--sizes-mb: each from 1 to 4096")
    if not a.rate_mbit > 0 or a.trials < 1:
        p.error("--rate-mbit > 0 and --trials >= 1")
    if os.geteuid() != 0:
        print("kvtransfer bench: needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    r = asyncio.run(run(sizes, a.rate_mbit, a.trials))
    print(render(r))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
