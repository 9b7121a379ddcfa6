"""`galaxy chaos`: one fault under load, and what it cost.

Starts its own control plane (two instances of each control function,
emulated, process or bwrap nodes, mutual TLS, supervised as `galaxy up` does; its
own etcd when the fault needs one, and two leader-elected controllers with
``--ha``), deploys a few functions, sends requests through the SDK at a
fixed rate, and at ``--at`` seconds injects the fault (chaos_faults.py: kill
-9 of one process of a kind, by PID; kill -9 of the leading controller;
SIGSTOP of a node agent; an etcd outage; a restart of the whole control
plane). The report: requests sent, succeeded, failed by code, hung; time to
detect and to recover; whether the dead part was replaced; functions before
and after; latency before and after the fault (docs/reliability.md, "Fault
suite"). Bounded in time and requests; stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.launch.etcd import LocalEtcd
from controlplane.launch.up import Supervisor, UpConfig
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from controlplane.tools.chaos_checks import leaks_gone
from controlplane.tools.chaos_faults import ECHO, NEEDS_HA, Found, Run
from controlplane.tools.chaos_more import (
    FAULTS,
    NEEDS_ETCD,
    ORPHAN_CHECK_S,
    config_for,
    fault,
)
from controlplane.tools.common import CliError

#: Outage of the etcd fault and stop of the SIGSTOP fault unless --outage-s.
DEFAULT_OUTAGE_S = {"etcd": 15.0, "sigstop-nodeagent": 6.0}
HUNG = "HUNG"
#: The load goes on past --duration-s while the fault is under way, this long at most.
MAX_EXTRA_S = 120.0


def add_subparser(sub: Any) -> None:
    """``galaxy chaos``."""
    p = sub.add_parser("chaos", help="inject one fault under load and report what it cost")
    p.add_argument(
        "--fault",
        choices=FAULTS,
        default="dispatch",
        help="a kind to kill -9 (dispatch, schedule, clustermgr, agent, controller); "
        "controller-leader (kill -9 the leader, implies --ha); sigstop-nodeagent; etcd "
        "(stopped --outage-s); restart (the whole control plane, on the same etcd); "
        "controller-then-dispatch (kill -9 the controller, then a Dispatch: epochs never go "
        "backwards); delete-many (delete a function of --instances instances); none",
    )
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration-s", type=float, default=20.0, help="length of the load")
    p.add_argument("--at-s", type=float, default=8.0, help="when the fault happens")
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
    p.set_defaults(func=cmd_chaos)


@dataclass
class Outcome:
    """Requests of one run: (start time, latency s, error or "")."""

    rows: list[tuple[float, float, str]] = field(default_factory=list)
    #: The first message seen per error code (what a failure said).
    samples: dict[str, str] = field(default_factory=dict)
    #: The load's start (event-loop time): rows' start times count from it.
    t0: float = 0.0


async def _load(
    c: GalaxyClient,
    names: list[str],
    rate: float,
    duration_s: float,
    out: Outcome,
    hung_s: float = 5.0,
    until: asyncio.Event | None = None,
) -> None:
    """Open-loop load for duration_s, and on until ``until`` is set (a fault
    still under way; at most MAX_EXTRA_S more); a request still unanswered
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
        return until is not None and not until.is_set() and now - t0 < duration_s + MAX_EXTRA_S

    while more(now := loop.time()):
        t = asyncio.create_task(one(i, now))
        tasks[t] = now
        t.add_done_callback(lambda t: tasks.pop(t, None))
        i += 1
        # Open loop: the next request leaves on schedule whatever this one does.
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
    if tasks:
        await asyncio.wait(list(tasks), timeout=hung_s)
    for t, start in list(tasks.items()):
        t.cancel()
        out.rows.append((start - t0, loop.time() - start, HUNG))


def report(
    out: Outcome,
    at_s: float,
    fault: str,
    victim: str,
    back: bool | None,
    hung_s: float = 5.0,
    fault_t: float | None = None,
    registered_t: float | None = None,
) -> dict[str, Any]:
    """The summary of one run (pure). ``fault_t``: when the fault was
    injected, in the rows' time (requests in flight then are counted apart);
    ``registered_t``: when a restarted agent was seen registered (requests
    sent from the fault until then are counted apart too)."""
    rows = sorted(out.rows)
    ok = [r for r in rows if not r[2]]
    errors: dict[str, int] = {}
    for r in rows:
        if r[2]:
            errors[r[2]] = errors.get(r[2], 0) + 1
    # The longest time with no request completing successfully.
    done = sorted(r[0] + r[1] for r in ok)
    if rows:  # failures after the last success count as a gap too
        done.append(max(done[-1] if done else 0.0, max(r[0] + r[1] for r in rows)))
    gaps = [b - a for a, b in itertools.pairwise(done)]
    # Recovered when the last request that failed after the fault ended.
    failed_after = [r[0] + r[1] for r in rows if r[2] and r[0] >= at_s]

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
        "succeeded": len(ok),
        "failed": len(rows) - len(ok),
        "errors": errors,
        "error_samples": dict(out.samples),
        "hung": sum(1 for r in rows if r[2] == HUNG or r[1] >= hung_s),
        # Failed (not hung) requests already in flight when the fault struck.
        "failed_in_flight_at_fault": 0
        if fault_t is None
        else sum(1 for r in rows if r[2] and r[2] != HUNG and r[0] <= fault_t <= r[0] + r[1]),
        # Failed (not hung) requests sent between the fault and the restarted
        # agent's registration: nothing could know the instance had died.
        "failed_before_registration": 0
        if fault_t is None or registered_t is None
        else sum(1 for r in rows if r[2] and r[2] != HUNG and fault_t < r[0] < registered_t),
        "recover_s": round(max(failed_after) - at_s, 3) if failed_after else 0.0,
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
    outage_s = args.outage_s or DEFAULT_OUTAGE_S.get(args.fault, 0.0)
    if args.at_s + outage_s >= args.duration_s:
        raise CliError("the load must outlast the outage: --at-s + --outage-s < --duration-s")
    ha = args.ha or args.fault in NEEDS_HA
    with tempfile.TemporaryDirectory(prefix="galaxy-chaos-") as tmp:
        etcd = None
        if ha or args.fault in NEEDS_ETCD:
            try:
                etcd = LocalEtcd(Path(tmp) / "etcd")
            except RuntimeError as e:
                raise CliError(f"--fault {args.fault}: {e}") from None
        cfg = UpConfig.for_tool(
            dispatch=2, schedule=2, clustermgr=2, nodes=args.nodes, sandbox=args.sandbox,
            run_dir=Path(tmp), tls=True, nodes_per_agent=1, ha=ha,
            state=etcd.url if etcd else "memory://",
            autoscale_control=args.autoscale_t_df is not None,
            controller_args=[] if args.autoscale_t_df is None
            else ["--t-df", str(args.autoscale_t_df)],
        )  # fmt: skip
        more = config_for(args.fault, args.instances, args.nodes, args.orphan_check_s)
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
                fault_done = asyncio.Event()
                load = asyncio.create_task(
                    _load(c, names, args.rate, args.duration_s, out, args.hung_s, fault_done)
                )
                await asyncio.sleep(args.at_s)  # the fault's scheduled time
                found = Found()
                try:
                    if args.fault != "none":
                        found = await fault(args.fault)(r)
                except BaseException:
                    load.cancel()
                    raise
                finally:
                    fault_done.set()
                await load
                functions_after = len(await c.list_functions())
                gone = await leaks_gone(c) if args.fault != "restart" else 0.0
            fault_t = r.fault_at - out.t0 if r.fault_at else None
            registered_t = r.registered_at - out.t0 if r.registered_at else None
            summary = report(out, args.at_s, args.fault, found.victim, found.replaced,
                             args.hung_s, fault_t, registered_t)  # fmt: skip
            rep.update(summary)
            rep.update(
                detect_s=None if found.detect_s is None else round(found.detect_s, 3),
                functions_before=functions_before,
                functions_after=functions_after,
                ha=ha,
                leaks_gone_s=None if gone is None else round(gone, 2),
                **found.extra,
            )
            # A restart stops everything: its requests meanwhile fail by design.
            # A killed agent takes its instances along (they live in its
            # sandboxes): a request in flight on one, or sent to one before
            # the restarted agent registered (until then nothing knows it
            # died), cannot be answered and is counted apart; every request
            # sent after the registration counts, and so does every hang.
            excused = 0
            if args.fault == "agent":
                excused = rep["failed_in_flight_at_fault"] + rep["failed_before_registration"]
            load_ok = args.fault == "restart" or (rep["failed"] - excused == 0 and rep["hung"] == 0)
            rep["goal"] = "; ".join(
                g for g in ("" if args.fault == "restart" else
                            "0 requests failed or hung" + (
                                " (but those on the killed agent's instances before it"
                                " registered again)"
                                if args.fault == "agent" else ""),
                            found.goal) if g
            )  # fmt: skip
            rep["goal_met"] = load_ok and found.goal_met
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


def check_args(args: argparse.Namespace) -> None:
    """Refuse a run that cannot mean anything, naming the flag, before any
    process starts (a negative rate would otherwise start a cluster and then
    fail in the load generator)."""
    positive = {
        "--rate": args.rate,
        "--duration-s": args.duration_s,
        "--hung-s": args.hung_s,
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
