"""`galaxy chaos`: faults under load, and what each cost.

Starts its own control plane (two instances of each control function,
emulated, process or bwrap nodes, mutual TLS, supervised as `galaxy up` does; its
own etcd when a fault needs one, and two leader-elected controllers with
``--ha``), deploys a few functions, sends requests through the SDK at a
fixed rate, and at ``--at-s`` seconds injects the fault (chaos_faults.py: kill
-9 of one process of a kind, by PID; kill -9 of the leading controller;
SIGSTOP of a node agent; an etcd outage; a restart of the whole control
plane), or several one after another (``--fault a,b,c``, ``--every-s``
apart; chaos_report.py shares the requests out between them). The report:
requests sent, succeeded, failed by code, hung; time to detect and to
recover; whether the dead part was replaced; functions before and after;
latency before and after the fault (docs/reliability.md, "Fault suite"),
per fault when there are several. Bounded in time and requests; stops
everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.launch.etcd import LocalEtcd
from controlplane.launch.up import Supervisor, UpConfig
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from controlplane.tools.chaos_checks import leaks_gone
from controlplane.tools.chaos_faults import ECHO, NEEDS_HA, Found, Run, _now
from controlplane.tools.chaos_more import (
    FAULTS,
    NEEDS_ETCD,
    ORPHAN_CHECK_S,
    config_for,
    fault,
)
from controlplane.tools.chaos_report import (
    HUNG,
    RESTART,
    Outcome,
    joined_goal,
    load_verdict,
    parse_faults,
    report,
    windows,
)
from controlplane.tools.common import CliError

#: Outage of the etcd fault and stop of the SIGSTOP fault unless --outage-s.
DEFAULT_OUTAGE_S = {"etcd": 15.0, "sigstop-nodeagent": 6.0}
#: The load goes on past --duration-s while a fault is under way, this long at most (per fault).
MAX_EXTRA_S = 120.0
#: Several faults: the load between one fault's end and the next.
EVERY_S = 5.0


def add_subparser(sub: Any) -> None:
    """``galaxy chaos``."""
    p = sub.add_parser(
        "chaos", help="inject one fault, or several one after another, under load and report "
        "what each cost",
    )  # fmt: skip
    p.add_argument(
        "--fault",
        type=lambda text: parse_faults(text, FAULTS),
        default=["dispatch"],
        metavar="FAULT[,FAULT...]",
        help="a kind to kill -9 (dispatch, schedule, clustermgr, agent, controller); "
        "controller-leader (kill -9 the leader, implies --ha); sigstop-nodeagent; etcd "
        "(stopped --outage-s); restart (the whole control plane, on the same etcd); "
        "controller-then-dispatch (kill -9 the controller, then a Dispatch: epochs never go "
        "backwards); delete-many (delete a function of --instances instances); none. "
        "Several, comma-separated (e.g. dispatch,schedule,clustermgr), are injected one "
        "after another in one control plane, each --every-s after the previous one was "
        'over, each with its own report and verdict under "faults"',
    )
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration-s", type=float, default=20.0, help="length of the load")
    p.add_argument("--at-s", type=float, default=8.0, help="when the (first) fault happens")
    p.add_argument(
        "--every-s",
        type=float,
        default=EVERY_S,
        help="several faults: the load between one fault's end and the next one (and "
        "after the last)",
    )
    p.add_argument(
        "--outage-s",
        type=float,
        default=None,
        help="how long etcd stays down (default 15) or a node agent stopped (default 6)",
    )
    p.add_argument("--ha", action="store_true", help="two leader-elected controllers (and etcd)")
    p.add_argument(
        "--hung-s", type=float, default=5.0, help="a request not answered within this is hung"
    )
    p.add_argument(
        "--autoscale-t-df",
        type=float,
        default=None,
        metavar="T",
        help="the controllers scale the control functions (local actuator), taking T "
        "requests/s as one Dispatch instance's capacity: a T below the rate makes them "
        "scale out during the run (so a leader's death meets scale actions)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=5000,
        help="delete-many: instances of the function deleted (its min_scale)",
    )
    p.add_argument(
        "--orphan-check-s",
        type=float,
        default=ORPHAN_CHECK_S,
        help="delete-many: the node agents' orphan check period; the goal's grace period "
        "is 3 of them",
    )
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--sandbox",
        choices=["emulated", "process", "bwrap"],
        default="emulated",
        help="the node agents' sandbox (bwrap: `galaxy up`'s default, each instance in its own)",
    )
    p.add_argument("--functions", type=int, default=4)
    p.add_argument("--out", default=None, help="also write the report (JSON) here")
    p.add_argument(
        "--run-dir",
        default=None,
        help="the control plane's run directory (its logs), kept after the run; "
        "default: a temporary one, removed",
    )
    p.set_defaults(func=cmd_chaos)


async def _load(
    c: GalaxyClient,
    names: list[str],
    rate: float,
    duration_s: float,
    out: Outcome,
    hung_s: float = 5.0,
    until: asyncio.Event | None = None,
    max_extra_s: float = MAX_EXTRA_S,
) -> None:
    """Open-loop load for duration_s, and on until ``until`` is set (a fault
    still under way; at most ``max_extra_s`` more); a request still unanswered
    hung_s after the load ends is cancelled and counted as hung."""
    loop = asyncio.get_running_loop()
    t0 = out.t0 = loop.time()
    tasks: dict[asyncio.Task[None], float] = {}

    async def one(i: int, start: float) -> None:
        # perf_counter for latency: uvloop's clock ticks in milliseconds.
        p0 = time.perf_counter()
        try:
            await c.invoke(names[i % len(names)], b"x")
            out.rows.append((start - t0, time.perf_counter() - p0, ""))
        except Exception as e:  # GalaxyError, or anything else the client lets out
            code = getattr(getattr(e, "code", None), "name", None) or type(e).__name__
            out.rows.append((start - t0, time.perf_counter() - p0, code))
            out.samples.setdefault(code, str(e)[:300])

    i = 0

    def more(now: float) -> bool:
        if now - t0 < duration_s:
            return True
        return until is not None and not until.is_set() and now - t0 < duration_s + max_extra_s

    while more(now := loop.time()):
        t = asyncio.create_task(one(i, now))
        tasks[t] = now
        t.add_done_callback(lambda t: tasks.pop(t, None))
        i += 1
        # Open loop: the next request leaves on schedule whatever this one does.
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
    out.load_s = loop.time() - t0
    if tasks:
        await asyncio.wait(list(tasks), timeout=hung_s)
    for t, start in list(tasks.items()):
        t.cancel()
        out.rows.append((start - t0, loop.time() - start, HUNG))


@dataclass
class Injected:
    """One fault of a run, as injected: what it found, and when (loop time)."""

    name: str
    found: Found
    #: when the fault struck (its own mark, else when it began)
    at: float
    #: agent: when the restarted agent was seen registered (0: not seen)
    registered_at: float = 0.0


async def _inject(r: Run, args: argparse.Namespace, until: asyncio.Event) -> list[Injected]:
    """The faults of ``args.fault`` one after another: the first at
    ``--at-s``, each next ``--every-s`` after the previous one was over
    (and as long again after the last, when there are several); sets
    ``until`` at the end, whatever happens."""
    done: list[Injected] = []
    several = len(args.fault) > 1
    try:
        await asyncio.sleep(args.at_s)  # the first fault's scheduled time
        for i, name in enumerate(args.fault):
            if i:
                await asyncio.sleep(args.every_s)  # a settled cluster for the next
            r.fault_at = r.registered_at = 0.0
            r.outage_s = args.outage_s or DEFAULT_OUTAGE_S.get(name, 0.0)
            began = _now()
            found = Found() if name == "none" else await fault(name)(r)
            done.append(Injected(name, found, r.fault_at or began, r.registered_at))
        if several:
            await asyncio.sleep(args.every_s)  # the last one's aftermath, measured
    finally:
        until.set()
    return done


def _fault_report(
    out: Outcome, rows: list[tuple[float, float, str]], f: Injected, hung_s: float
) -> dict[str, Any]:
    """One fault's report from its share of the requests, and its verdict."""
    part = Outcome(rows=rows, samples={}, t0=out.t0)
    for row in rows:
        if row[2]:
            part.samples.setdefault(row[2], out.samples.get(row[2], ""))
    at = f.at - out.t0
    registered_t = f.registered_at - out.t0 if f.registered_at else None
    rep = report(part, at, f.name, f.found.victim, f.found.replaced, hung_s, at, registered_t)
    rep["at_s"] = round(at, 3)
    rep["detect_s"] = None if f.found.detect_s is None else round(f.found.detect_s, 3)
    rep.update(f.found.extra)
    load_goal, load_ok = load_verdict(f.name, rep)
    rep["goal"] = joined_goal(load_goal, f.found.goal)
    rep["goal_met"] = load_ok and f.found.goal_met
    return rep


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """One chaos run (one fault or several); returns the report."""
    faults: list[str] = args.fault
    if not 0 < args.at_s < args.duration_s:
        raise CliError("--at-s must be between 0 and --duration-s")
    outage_s = args.outage_s or max(DEFAULT_OUTAGE_S.get(f, 0.0) for f in faults)
    if len(faults) == 1 and args.at_s + outage_s >= args.duration_s:
        raise CliError("the load must outlast the outage: --at-s + --outage-s < --duration-s")
    ha = args.ha or any(f in NEEDS_HA for f in faults)
    with _run_dir(args.run_dir) as tmp:
        etcd = None
        if ha or any(f in NEEDS_ETCD for f in faults):
            try:
                etcd = LocalEtcd(Path(tmp) / "etcd")
            except RuntimeError as e:
                raise CliError(f"--fault {','.join(faults)}: {e}") from None
        cfg = UpConfig.for_tool(
            dispatch=2, schedule=2, clustermgr=2, nodes=args.nodes, sandbox=args.sandbox,
            run_dir=Path(tmp), tls=True, nodes_per_agent=1, ha=ha,
            state=etcd.url if etcd else "memory://",
            autoscale_control=args.autoscale_t_df is not None,
            controller_args=[] if args.autoscale_t_df is None
            else ["--t-df", str(args.autoscale_t_df)],
        )  # fmt: skip
        more: dict[str, Any] = {}
        for f in faults:
            more.update(config_for(f, args.instances, args.nodes, args.orphan_check_s))
        more["controller_args"] = cfg.controller_args + more.get("controller_args", [])
        cfg = cfg.replace(**more)
        sup = Supervisor(cfg)
        r: Run | None = None
        rep: dict[str, Any] = {}
        try:
            if etcd is not None:
                await etcd.start()
            ep = await sup.start()
            await sup.wait_nodes_registered()
            async with GalaxyClient(
                ep["controller"], timeout=10, tls=sup.client_tls(), token=sup.client_token()
            ) as c:
                r = Run(
                    cfg, sup, c, etcd, outage_s, instances=args.instances,
                    orphan_check_s=args.orphan_check_s,
                )  # fmt: skip
                r.supervise()
                names = [f"chaos-{i}" for i in range(args.functions)]
                for n in names:
                    spec = specs.load_file(ECHO)  # a real process with the process sandbox
                    spec.name, spec.concurrency = n, 8
                    if n == names[0]:
                        # One instance and no other to fall back on: a
                        # ghost of it fails every request that reaches it.
                        spec.max_scale = 1
                    await c.deploy(spec)
                functions_before = len(await c.list_functions())
                out = Outcome()
                faults_done = asyncio.Event()
                load = asyncio.create_task(
                    _load(c, names, args.rate, args.duration_s, out, args.hung_s, faults_done,
                          MAX_EXTRA_S * len(faults))
                )  # fmt: skip
                try:
                    injected = await _inject(r, args, faults_done)
                except BaseException:
                    load.cancel()
                    raise
                await load
                functions_after = len(await c.list_functions())
                gone = await leaks_gone(c) if RESTART not in faults else 0.0
            starts = [f.at - out.t0 for f in injected]
            per_fault = [
                _fault_report(out, rows, f, args.hung_s)
                for rows, f in zip(windows(out.rows, starts), injected, strict=True)
            ]
            if len(per_fault) == 1:  # one fault: its report is the run's
                rep.update(per_fault[0])
            else:
                rep.update(report(out, starts[0], ",".join(faults), "", None, args.hung_s))
                rep["faults"] = per_fault
                rep["goal"] = " | ".join(f"{f['fault']}: {f['goal']}" for f in per_fault)
                rep["goal_met"] = all(f["goal_met"] for f in per_fault)
            rep.update(
                load_s=round(out.load_s, 3),
                functions_before=functions_before,
                functions_after=functions_after,
                ha=ha,
                leaks_gone_s=None if gone is None else round(gone, 2),
            )
            return rep
        finally:
            if r is not None:
                await r.unsupervise()
                sup = r.sup
            # What was running at the end, for a check that none outlives the run.
            pids = [c.proc.pid for c in sup.children if c.proc.returncode is None]
            if etcd is not None and etcd.pid is not None:
                pids.append(etcd.pid)
            rep["pids"] = pids
            await sup.stop()
            if etcd is not None:
                await etcd.stop()


@contextlib.contextmanager
def _run_dir(path: str | None) -> Iterator[str]:
    """``path`` (created, kept: its logs explain a failed run), or a
    temporary directory removed afterwards."""
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="galaxy-chaos-") as tmp:
        yield tmp


def check_args(args: argparse.Namespace) -> None:
    """Refuse a run that cannot mean anything, naming the flag, before any
    process starts (a negative rate would otherwise start a cluster and then
    fail in the load generator)."""
    positive = {
        "--rate": args.rate,
        "--duration-s": args.duration_s,
        "--hung-s": args.hung_s,
        "--every-s": args.every_s,
        "--orphan-check-s": args.orphan_check_s,
        "--nodes": args.nodes,
        "--functions": args.functions,
        "--instances": args.instances,
    }
    if args.outage_s is not None:
        positive["--outage-s"] = args.outage_s
    if args.autoscale_t_df is not None:
        positive["--autoscale-t-df"] = args.autoscale_t_df
    for flag, value in positive.items():
        if not value > 0:  # also refuses NaN
            raise CliError(f"{flag}: must be greater than 0 (got {value:g})")
    if not 0 <= args.at_s < args.duration_s:
        raise CliError(
            f"--at-s: the fault must happen during the load, from 0 to below "
            f"--duration-s {args.duration_s:g} (got {args.at_s:g})"
        )


async def cmd_chaos(args: argparse.Namespace) -> int:
    """Print (and optionally write) the report; exit 1 if the goal is not met."""
    check_args(args)
    t0 = time.monotonic()
    try:
        rep = await run(args)
    except RuntimeError as e:
        raise CliError(str(e)) from None
    rep["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(rep, indent=2)
    print(text)
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text + "\n")
    return 0 if rep["goal_met"] else 1
