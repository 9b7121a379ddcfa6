"""`galaxy chaos`: one fault under load, and what it cost.

Starts its own control plane (two instances of each control function,
emulated or process nodes, mutual TLS, supervised as `galaxy up` does),
deploys a few functions, sends requests through the SDK at a fixed rate,
and at ``--at`` seconds kills one process of the chosen kind with SIGKILL
(by PID). The report: requests sent, failed (by error), the longest stretch
without a successful request, latency before and after the fault, and
whether the victim came back (docs/reliability.md, "Fault suite").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.launch.restart import RestartPolicy
from controlplane.launch.supervise import supervise
from controlplane.launch.up import Supervisor, UpConfig
from controlplane.runtime import spec as specs
from controlplane.runtime.errors import GalaxyError
from controlplane.sdk.client import GalaxyClient
from controlplane.tools.common import CliError

ECHO = Path(__file__).resolve().parents[2] / "examples" / "echo.yaml"
FAULTS = ("dispatch", "schedule", "clustermgr", "agent", "controller", "none")


def add_subparser(sub: Any) -> None:
    """``galaxy chaos``."""
    p = sub.add_parser("chaos", help="kill one component under load and report what it cost")
    p.add_argument("--fault", choices=FAULTS, default="dispatch", help="kind to kill -9")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration-s", type=float, default=20.0, help="length of the load")
    p.add_argument("--at-s", type=float, default=8.0, help="when the fault happens")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--sandbox", choices=["emulated", "process"], default="emulated")
    p.add_argument("--functions", type=int, default=4)
    p.add_argument("--out", default=None, help="also write the report (JSON) here")
    p.set_defaults(func=cmd_chaos)


@dataclass
class Outcome:
    """Requests of one run: (start time, latency s, error or "")."""

    rows: list[tuple[float, float, str]] = field(default_factory=list)


async def _load(
    c: GalaxyClient, names: list[str], rate: float, duration_s: float, out: Outcome
) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, start: float) -> None:
        # perf_counter for latency: uvloop's clock ticks in milliseconds.
        p0 = time.perf_counter()
        try:
            await c.invoke(names[i % len(names)], b"x")
            out.rows.append((start - t0, time.perf_counter() - p0, ""))
        except GalaxyError as e:
            out.rows.append((start - t0, time.perf_counter() - p0, e.code.name))

    i = 0
    while (now := loop.time()) - t0 < duration_s:
        t = asyncio.create_task(one(i, now))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        i += 1
        # Open loop: the next request leaves on schedule whatever this one does.
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
    await asyncio.gather(*tasks)


def _victim(sup: Supervisor, fault: str) -> tuple[str, int] | None:
    prefix = {"agent": "agent-", "controller": "controller"}.get(fault, f"{fault}-")
    for child in sup.children:
        if child.name.startswith(prefix) and child.proc.returncode is None:
            return child.name, child.proc.pid
    return None


def report(out: Outcome, at_s: float, fault: str, victim: str, back: bool) -> dict[str, Any]:
    """The summary of one run (pure)."""
    rows = sorted(out.rows)
    ok = [r for r in rows if not r[2]]
    errors: dict[str, int] = {}
    for r in rows:
        if r[2]:
            errors[r[2]] = errors.get(r[2], 0) + 1
    # The longest time with no request completing successfully.
    done = sorted(r[0] + r[1] for r in ok)
    gaps = [b - a for a, b in itertools.pairwise(done)]

    def p(rows: list[tuple[float, float, str]], q: float) -> float | None:
        lat = [r[1] * 1000 for r in rows]
        if len(lat) < 2:
            return None
        return round(statistics.quantiles(lat, n=100)[int(q * 100) - 1], 2)

    before = [r for r in ok if r[0] < at_s]
    after = [r for r in ok if r[0] >= at_s]
    return {
        "fault": fault,
        "victim": victim,
        "victim_back": back,
        "requests": len(rows),
        "failed": len(rows) - len(ok),
        "errors": errors,
        "longest_gap_s": round(max(gaps, default=0.0), 3),
        "p50_ms_before": p(before, 0.5),
        "p99_ms_before": p(before, 0.99),
        "p50_ms_after": p(after, 0.5),
        "p99_ms_after": p(after, 0.99),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """One chaos run; returns the report."""
    if not 0 < args.at_s < args.duration_s:
        raise CliError("--at-s must be between 0 and --duration-s")
    with tempfile.TemporaryDirectory(prefix="galaxy-chaos-") as tmp:
        cfg = UpConfig(
            dispatch=2, schedule=2, clustermgr=2, nodes=args.nodes, sandbox=args.sandbox,
            run_dir=Path(tmp), tls=True, nodes_per_agent=1,
        )  # fmt: skip
        sup = Supervisor(cfg)
        stop = asyncio.Event()
        watcher: asyncio.Task[str | None] | None = None
        try:
            ep = await sup.start()
            await sup.wait_nodes_registered()
            watcher = asyncio.create_task(supervise(sup, stop, RestartPolicy()))
            async with GalaxyClient(
                ep["controller"], timeout=10, tls=sup.client_tls(), token=sup.client_token()
            ) as c:
                names = [f"chaos-{i}" for i in range(args.functions)]
                for n in names:
                    spec = specs.load_file(ECHO)  # a real process with the process sandbox
                    spec.name, spec.concurrency = n, 8
                    await c.deploy(spec)
                out = Outcome()
                load = asyncio.create_task(_load(c, names, args.rate, args.duration_s, out))
                await asyncio.sleep(args.at_s)  # the fault's scheduled time
                victim, pid = ("", 0)
                if args.fault != "none":
                    found = _victim(sup, args.fault)
                    if found is None:
                        raise CliError(f"no running {args.fault} process to kill")
                    victim, pid = found
                    os.kill(pid, signal.SIGKILL)
                await load
            back = any(
                ch.name == victim and ch.proc.returncode is None and ch.proc.pid != pid
                for ch in sup.children
            )
            return report(out, args.at_s, args.fault, victim, back or args.fault == "none")
        finally:
            stop.set()
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher
            await sup.stop()


async def cmd_chaos(args: argparse.Namespace) -> int:
    """Print (and optionally write) the report; exit 1 if any request failed."""
    t0 = time.monotonic()
    rep = await run(args)
    rep["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(rep, indent=2)
    print(text)
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text + "\n")
    return 1 if rep["failed"] else 0
