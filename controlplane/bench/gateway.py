"""Gateway overhead, measured in one run (`python -m controlplane.bench.gateway`):
the same warm requests to the echo function (1) straight to its instance,
(2) through a bare aiohttp reverse proxy (the floor any proxy on this HTTP
stack pays), (3) through a Galaxy gateway without its slot cache (a
Dispatch call per request) and (4) through one with it (a lease reused
while the function is hot). The two gateways are processes started here
the way `galaxy up` starts its own (same flags, `--no-slot-cache` on one).
Modes alternate in rounds so that the machine's drift hits them alike; the
report gives latencies and the ratios the goals are stated in
(docs/gateway.md), and the CPU spent per request of each mode by the
node (its agents and everything they started: the instances, and the door
an instance in a sandbox of its own is reached through, docs/security.md),
by the mode's proxy process and by this load generator: where every core
is busy, throughput is the inverse of their sum.

Needs a running `galaxy up` (its run dir) with examples/echo.yaml deployed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane.launch.endpoints import default_run_dir, read_endpoints
from controlplane.runtime import credentials, leasetoken, tlsfiles
from controlplane.runtime import spec as specs
from controlplane.runtime.host import (
    READY_PREFIX,
    install_uvloop,
    serve_command,
    watch_lifeline,
)
from controlplane.runtime.procs import Spawned, spawn
from controlplane.sdk.client import GalaxyClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "echo.yaml"
#: The paths measured, in the order each round runs them.
MODES = ("direct", "bare_proxy", "bare_proxy_inproc", "gateway_nocache", "gateway_cache")


async def _bare_proxy(upstream: str) -> tuple[web.AppRunner, str]:
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        # The lease, for the node's entry (what a gateway adds too).
        lease = {k: v for k, v in request.headers.items() if k == leasetoken.HEADER}
        async with session.post(f"http://{upstream}/", data=body, headers=lease) as r:
            out = web.StreamResponse(status=r.status)
            out.content_type = r.content_type
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(lambda _: session.close())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def _serve_bare_proxy(upstream: str) -> None:
    """The bare proxy as a process of its own, as the gateways run: ready
    line on stdout, stops when stdin (its lifeline) closes."""
    runner, address = await _bare_proxy(upstream)
    stop = asyncio.Event()
    watch_lifeline(stop)
    print(READY_PREFIX + json.dumps({"address": address}), flush=True)
    await stop.wait()
    await runner.cleanup()


async def _spawn(*cmd: str) -> tuple[Spawned, dict[str, str]]:
    """A server process (stdin: its lifeline); returns it and its ready line."""
    proc = await spawn(*cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            raise SystemExit(f"{' '.join(cmd[:6])} exited before it was ready")
        if line.startswith(READY_PREFIX):
            return proc, json.loads(line[len(READY_PREFIX) :])


async def _gateway(ep: dict[str, str], name: str, *flags: str) -> tuple[Spawned, dict[str, str]]:
    """A gateway process on the `galaxy up` cluster, as `galaxy up` starts one."""
    cmd = serve_command("gateway", name, "127.0.0.1", *tlsfiles.flags(ep.get("tls_dir")))
    return await _spawn(*cmd, "--controller", ep["controller"], *flags)


async def _slot_counts(metrics: str) -> dict[str, float]:
    """The slot cache's hits and misses from a gateway's /metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"http://{metrics}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("galaxy_gateway_slot_cache_total{"):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def _threads_cpu_ns(pids: list[int]) -> dict[tuple[int, int], int]:
    """CPU time (ns) so far of every thread of pids, by (pid, tid): the
    scheduler's account (/proc/PID/task/TID/schedstat), finer than the
    10 ms ticks of stat."""
    out: dict[tuple[int, int], int] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                out[(pid, int(task.name))] = int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended meanwhile
    return out


def process_cpu_ns(pid: int) -> int:
    """CPU time (ns) so far of a whole process, threads that ended included
    (/proc/PID/stat, in clock ticks)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) * _TICK_NS
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class _Cpu:
    """One reading of pids' CPU: per thread, and per process."""

    threads: dict[tuple[int, int], int]
    processes: dict[int, int]

    @classmethod
    def now(cls, pids: list[int]) -> _Cpu:
        return cls(_threads_cpu_ns(pids), {p: process_cpu_ns(p) for p in pids})

    def since(self, before: _Cpu) -> int:
        """CPU (ns) used between before and this reading. Per thread, so
        that it is exact; but a thread that ended in between took its time
        with it (the sum of the threads alive would go down: a negative
        figure once), so a process that lost one counts its ticks instead."""
        total = 0
        for pid in self.processes:
            mine = {k: v for k, v in self.threads.items() if k[0] == pid}
            was = {k: v for k, v in before.threads.items() if k[0] == pid}
            exact = sum(v - was.get(k, 0) for k, v in mine.items())
            if was.keys() - mine.keys():
                exact = max(exact, self.processes[pid] - before.processes.get(pid, 0))
            total += exact
        return total


_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _descendants_cpu_ns(roots: list[int]) -> int:
    """CPU time (ns) so far of every process below roots (an agent's
    sandboxes and instances), from /proc/PID/stat in clock ticks: it keeps
    the time of threads that ended (an instance's thread per connection),
    which the per-thread schedstat loses, and of processes that ended (in
    their reaper's account of its children, the roots' included), so that
    an instance that ends between two readings does not take its time
    with it."""
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    reaped: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces: split after it.
            f = stat.read_text().rsplit(")", 1)[1].split()
            pid, ppid = int(stat.parent.name), int(f[1])
            times[pid] = (int(f[11]) + int(f[12])) * _TICK_NS  # utime, stime
            reaped[pid] = (int(f[13]) + int(f[14])) * _TICK_NS  # cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    total = sum(reaped.get(r, 0) for r in roots)
    todo = [c for r in roots for c in children.get(r, [])]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0) + reaped.get(pid, 0)
        todo += children.get(pid, [])
    return total


def _cpu_now(agents: list[int], proxy: list[int]) -> tuple[_Cpu, int, _Cpu, int]:
    """A reading of the CPU so far of the agents (where the node's entry
    runs), of every process below them (ns), of the proxy, of this process
    (ns); ``_used`` turns two into the node's, the agents', the proxy's and
    this process's CPU in between."""
    return _Cpu.now(agents), _descendants_cpu_ns(agents), _Cpu.now(proxy), time.process_time_ns()


def _used(
    before: tuple[_Cpu, int, _Cpu, int], after: tuple[_Cpu, int, _Cpu, int]
) -> tuple[int, int, int, int]:
    """(node, agent, proxy, client) CPU (ns) between two ``_cpu_now``."""
    agent = after[0].since(before[0])
    return agent + after[1] - before[1], agent, after[2].since(before[2]), after[3] - before[3]


async def _round(
    url: str, n: int, concurrency: int, headers: dict[str, str] | None = None
) -> tuple[list[float], float]:
    lat: list[float] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), headers=headers
    ) as s:  # fmt: skip
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                async with s.post(url, data=b"x") as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return lat, n / (time.perf_counter() - t0)


async def measure(
    run_dir: Path,
    n: int,
    rounds: int,
    concurrency: int,
    slot_idle_ms: float | None = None,
    agent_pids: tuple[int, ...] = (),
    modes: tuple[str, ...] = MODES,
) -> dict[str, object]:
    """Latencies (ms) and requests/s per mode, and the ratios. agent_pids:
    node agents not started by the `galaxy up` (whose own are counted too).
    modes: which of MODES to run (the others' proxies are not started)."""
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"modes: some of {', '.join(MODES)}; got {', '.join(modes) or 'none'}")
    ep = read_endpoints(run_dir)
    if not ep or not ep.get("gateway"):
        raise SystemExit(f"no `galaxy up` with a gateway in {run_dir}")
    token = credentials.client_token(ep)
    auth = {"Authorization": f"Bearer {token}"} if token else None
    async with GalaxyClient(
        ep["controller"], tls=tlsfiles.client_tls(ep.get("tls_dir")), token=token
    ) as c:
        addr = await c.dispatch("echo")  # a warm instance to aim at directly
        await c.release(addr)
    if addr.lease_token:  # the node's entry wants it; gateways use their own
        auth = {**(auth or {}), leasetoken.HEADER: addr.lease_token}
    # The bare proxy twice: in a process of its own, as the gateways run
    # (the yardstick), and inside this load generator, as measured before.
    runner, inproc = await _bare_proxy(addr.address)
    idle = ["--slot-idle-ms", str(slot_idle_ms)] if slot_idle_ms else []
    bare = [sys.executable, "-m", "controlplane.bench.gateway", "--serve-bare-proxy", addr.address]
    starts = {
        "bare_proxy": lambda: _spawn(*bare),
        "gateway_nocache": lambda: _gateway(ep, "bench-nocache", "--no-slot-cache"),
        "gateway_cache": lambda: _gateway(ep, "bench-cache", *idle),
    }
    procs = {m: await start() for m, start in starts.items() if m in modes}
    gateways = tuple(m for m in ("gateway_nocache", "gateway_cache") if m in procs)
    paths = {
        "bare_proxy": "/",
        "gateway_nocache": "/functions/echo",
        "gateway_cache": "/functions/echo",
    }
    at = {"direct": addr.address, "bare_proxy_inproc": inproc}
    at.update((m, procs[m][1]["address"]) for m in procs)
    # In MODES' order, which the rounds keep.
    urls = {m: f"http://{at[m]}{paths.get(m, '/')}" for m in MODES if m in modes}
    lat: dict[str, list[float]] = {k: [] for k in urls}
    rate: dict[str, list[float]] = {k: [] for k in urls}
    agents = [c["pid"] for c in ep.get("components", ()) if c.get("kind") == "nodeagent"]
    agents += agent_pids
    # CPU per mode (ns): the node, its agents alone, the mode's proxy
    # process, this process.
    parts = ("node", "agent", "proxy", "client")
    cpu: dict[str, dict[str, int]] = {k: dict.fromkeys(parts, 0) for k in urls}
    try:
        for url in urls.values():  # warm-up: connections, the instance
            await _round(url, 200, concurrency, auth)
        for _ in range(rounds):
            for mode, url in urls.items():
                # The same header on every mode: the instance ignores it.
                proxy = [procs[mode][0].pid] if mode in procs else []
                before = _cpu_now(agents, proxy)
                got, rps = await _round(url, n, concurrency, auth)
                after = _cpu_now(agents, proxy)
                for k, used in zip(parts, _used(before, after), strict=True):
                    cpu[mode][k] += used
                lat[mode] += got
                rate[mode].append(rps)
        slots = (
            await _slot_counts(procs["gateway_cache"][1]["metrics"])
            if "gateway_cache" in procs
            else {}
        )
    finally:
        await runner.cleanup()
        for proc, _ in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()  # the lifeline: it stops
            await asyncio.wait_for(proc.wait(), 30)

    def q(v: list[float], p: float) -> float:
        return statistics.quantiles(v, n=1000)[int(p * 1000) - 1] * 1000

    stats = {
        m: {
            "p50_ms": round(q(lat[m], 0.5), 3),
            "p99_ms": round(q(lat[m], 0.99), 3),
            "requests_per_s": round(statistics.median(rate[m]), 1),
            **{
                f"{k}_cpu_us_per_request": round(v / 1000 / (n * rounds), 1)
                for k, v in cpu[m].items()
            },
        }
        for m in urls
    }
    out: dict[str, object] = {
        "requests_per_mode": n * rounds,
        "concurrency": concurrency,
        "slot_idle_ms": slot_idle_ms or "default",
        "modes": stats,
        "slot_cache": slots,
    }
    for m in ("bare_proxy", *gateways):
        if m in stats:
            out[m] = _ratios(stats, m)
    return out


def _ratios(stats: dict[str, dict[str, float]], m: str) -> dict[str, float]:
    """Mode m against the direct path and the bare proxies, of those run."""
    g, out = stats[m], {}
    if "direct" in stats:
        d = stats["direct"]
        out["added_p50_ms"] = round(g["p50_ms"] - d["p50_ms"], 3)
        out["added_p99_ms"] = round(g["p99_ms"] - d["p99_ms"], 3)
    for base in ("bare_proxy", "bare_proxy_inproc"):
        if base in stats:
            rps = g["requests_per_s"] / stats[base]["requests_per_s"]
            out[f"vs_{base}_throughput"] = round(rps, 3)
    return out


async def measure_cold(run_dir: Path, n: int) -> dict[str, object]:
    """Cold starts (a new function's first request) through the gateway
    (the activator path: the gateway holds the request while Dispatch
    starts an instance) and through the SDK, alternating; medians in ms."""
    ep = read_endpoints(run_dir)
    if not ep or not ep.get("gateway"):
        raise SystemExit(f"no `galaxy up` with a gateway in {run_dir}")
    example = EXAMPLE
    took: dict[str, list[float]] = {"gateway": [], "sdk": []}
    tls = tlsfiles.client_tls(ep.get("tls_dir"))
    token = credentials.client_token(ep)
    auth = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        GalaxyClient(ep["controller"], tls=tls, token=token) as c,
        aiohttp.ClientSession(headers=auth) as http,
    ):
        for i in range(n):
            for mode in ("gateway", "sdk") if i % 2 == 0 else ("sdk", "gateway"):
                spec = specs.load_file(example)
                spec.name = f"cold-{mode}-{i}"
                await c.deploy(spec)
                t0 = time.perf_counter()
                if mode == "gateway":
                    url = f"http://{ep['gateway']}/functions/{spec.name}"
                    async with http.post(url, data=b"x") as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"{url}: HTTP {r.status}")
                else:
                    await c.invoke(spec.name, b"x")
                took[mode].append(time.perf_counter() - t0)
                await c.delete_function(spec.name)
    med = {m: round(statistics.median(v) * 1000, 1) for m, v in took.items()}
    return {
        "cold_starts_per_mode": n,
        "cold_median_ms": med,
        "gateway_vs_sdk_cold": round(med["gateway"] / med["sdk"], 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default=str(default_run_dir()))
    p.add_argument("--requests", type=int, default=1000, help="per mode and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--cold", type=int, default=0, help="also N cold starts per path")
    p.add_argument(
        "--slot-idle-ms", type=float, default=None, help="the cached gateway's --slot-idle-ms"
    )
    p.add_argument(
        "--agent-pid",
        type=int,
        action="append",
        default=[],
        help="a node agent not started by the `galaxy up` (its CPU per request is reported)",
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {','.join(MODES)} (default all)",
    )
    p.add_argument("--serve-bare-proxy", metavar="UPSTREAM", help=argparse.SUPPRESS)
    a = p.parse_args()
    install_uvloop()  # as `galaxy serve` (the gateways) runs
    if a.serve_bare_proxy:
        asyncio.run(_serve_bare_proxy(a.serve_bare_proxy))
        return
    out = asyncio.run(
        measure(
            Path(a.run_dir),
            a.requests,
            a.rounds,
            a.concurrency,
            a.slot_idle_ms,
            tuple(a.agent_pid),
            tuple(m for m in a.modes.split(",") if m),
        )
    )
    if a.cold:
        out["cold"] = asyncio.run(measure_cold(Path(a.run_dir), a.cold))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
