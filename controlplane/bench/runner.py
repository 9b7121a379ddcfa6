"""Runs a bench file against real control plane processes.

For every combination of parameter values: start the control plane (the
same ``Supervisor`` as ``galaxy up``, emulated sandboxes, optionally a fresh
etcd), then for each scenario: deploy its functions, measure the raw echo at
the scenario's concurrency, run the load generator process, and scrape the
Schedule and Dispatch /metrics endpoints around the measured phase.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.bench import experiment as ex
from controlplane.bench import plan as pl
from controlplane.bench import profile as prof
from controlplane.bench import promscrape as ps
from controlplane.bench import slo
from controlplane.bench import summary as sm
from controlplane.bench.echo import EchoProcess
from controlplane.bench.loadgen import MEASURED, MEASURING
from controlplane.bench.planes import ControlPlane, ControlPlanes, start_control_plane
from controlplane.launch.up import Supervisor
from controlplane.runtime import procs, servingruntime

SCHEMA = "galaxy-bench/1"
_DEPLOY_CONCURRENCY = 32
# Before the echo after a plan: wait until the control plane uses less than
# this (210 idle emulated nodes heartbeating use ~0.3 cores), at most so long.
SETTLED_CORES = 0.6
SETTLE_MAX_S = 30.0
#: ... for this long in a row: longer than a Dispatch autoscaler round (2 s),
#: whose retirements of the plan's idle instances come as a wave. With one
#: quiet step, 3 of 6 phases of a cold-streams run (2026-11-26, 7cbe9a9) measured
#: the echo after them at 579-696 req/s instead of ~1,700: each had settled
#: in its first 0.5 s step, before the wave.
SETTLE_QUIET_S = 2.5


@dataclass
class RunOptions:
    """Where results go and what else to do."""

    out: Path
    data_dir: Path
    profile: bool = False
    #: Wait for the control plane to go quiet before the echo after a plan
    #: (for trustworthy ratios; the short form, which checks no figure, skips it).
    settle: bool = True
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))
    #: Control planes and the echo server kept up across bench files (the
    #: short runs of many plans); None: this run starts and stops its own.
    planes: ControlPlanes | None = None
    #: Prefix of this run's function names: unique among runs sharing planes.
    tag: str = ""


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, Python, and the load average now."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        model = next(
            (ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), ""
        )
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": list(os.getloadavg()),
    }


async def run_bench(bf: pl.BenchFile, opts: RunOptions) -> dict[str, Any]:
    """Run every plan of a bench file; returns the results document."""
    objectives = _objectives(bf.experiment.objectives)
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "experiment": bf.experiment.name,
        "file": str(bf.path),
        "command": " ".join(["galaxy", "bench", *sys.argv[1:]]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "objectives": bf.experiment.objectives,
        "plans": [],
        "failures": [],
        "pids": [],  # every process the run started (for leak checks)
    }
    echo = await opts.planes.echo() if opts.planes is not None else EchoProcess()
    if opts.planes is None:
        await echo.start()
    results["pids"].append(echo.pid)
    try:
        plans = list(bf.experiment.plans())
        groups = itertools.groupby(plans, key=lambda p: json.dumps(p.params, sort_keys=True))
        for ci, (_key, grp) in enumerate(groups):
            group = list(grp)
            res, fails = await _run_config(bf, opts, ci, group, echo, objectives, results["pids"])
            results["plans"] += res
            results["failures"] += fails
    finally:
        if opts.planes is None:
            await echo.stop()
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    return results


def _objectives(texts: list[str]) -> list[slo.Objective]:
    out = []
    for t in texts:
        try:
            out += slo.parse(t)
        except slo.SloError:
            pass  # free-form objectives are reported as text, not checked
    return out


async def _run_config(
    bf: pl.BenchFile,
    opts: RunOptions,
    ci: int,
    plans: list[ex.Plan],
    echo: EchoProcess,
    objectives: list[slo.Objective],
    pids: list[int],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cp = pl.control_plane_config(bf, plans[0].params)
    done: list[dict[str, Any]] = []
    fails: list[dict[str, Any]] = []
    by_name: dict[str, dict[str, Any]] = {}
    deployed: list[str] = []
    plane: ControlPlane | None = None
    try:
        t0 = time.monotonic()
        if opts.planes is not None:
            plane = await opts.planes.get(cp)
        else:
            plane = await start_control_plane(cp, opts.out / "run" / f"config-{ci}", opts.log)
        pids += plane.pids
        opts.log(f"config {ci}: control plane up in {time.monotonic() - t0:.1f}s ({cp})")
        for si, plan in enumerate(plans):
            prefix = f"{opts.tag}p{ci}-{si}"
            try:
                r = await _run_plan(bf, opts, plan, cp, plane.sup, echo, prefix, by_name, deployed)
            except Exception as e:  # one bad plan must not lose the others' results
                opts.log(f"plan {plan.label!r} failed: {e}")
                fails.append({"label": plan.label, "params": plan.params, "error": str(e)})
                continue
            r["objectives"] = [
                {"objective": o.text, "value": v, "met": met}
                for o in objectives
                for v, met in [o.check(r)]
            ]
            done.append(r)
            by_name[plan.scenario.name] = r
            opts.log(_one_line(r))
        if opts.planes is not None:
            # Shared: the next run finds the function limit and the nodes'
            # capacity as a fresh control plane has them.
            try:
                await _delete(plane.sup.endpoints()["controller"], deployed)
            except Exception as e:
                error = f"deleting its functions from the shared control plane: {e}"
                fails.append({"label": f"config {ci}", "params": cp, "error": error})
    except Exception as e:
        for plan in plans[len(done) + len(fails) :]:
            fails.append({"label": plan.label, "params": plan.params, "error": str(e)})
        opts.log(f"config {ci} failed: {e}")
    finally:
        if opts.planes is None and plane is not None:
            await plane.stop()
    return done, fails


def _one_line(r: dict[str, Any]) -> str:
    t, rt = r["throughput"], r["ratio_to_echo"]
    w, c = r["latency_ms"]["warm_dispatch"], r["latency_ms"]["cold_start"]
    return (
        f"  {r['label']}: {t['requests_per_s']:.0f} req/s ({rt['requests_per_s']:.2f}x echo), "
        f"{t['instances_per_s']:.0f} inst/s; warm p99 {w['p99']:.2f} ms (n={w['count']}), "
        f"cold p99 {c['p99']:.2f} ms (n={c['count']}), errors {r['requests']['errors']}"
    )


async def _run_plan(
    bf: pl.BenchFile,
    opts: RunOptions,
    plan: ex.Plan,
    cp: dict[str, Any],
    sup: Supervisor,
    echo: EchoProcess,
    prefix: str,
    by_name: dict[str, dict[str, Any]],
    deployed: list[str],
) -> dict[str, Any]:
    s = pl.load_settings(bf, plan)
    if s.rate_of is not None:
        ref_name, frac = s.rate_of
        ref = by_name.get(ref_name)
        if ref is None:
            raise RuntimeError(f"rate_of: scenario {ref_name!r} has no result in this config")
        s = s.replace(arrival_rate=max(1.0, frac * ref["throughput"]["requests_per_s"]))
    wl = pl.build_workload(bf, plan, s, prefix, opts.data_dir)
    endpoints = sup.endpoints()
    deployed += [f.name for f in wl.functions]
    await _deploy(endpoints["controller"], wl)
    work = sup.cfg.run_dir / "load"
    echo_a = await _echo(bf, echo, s.concurrency, work, f"{prefix}-echo-before")
    comps = endpoints["components"]
    sched = [c["metrics"] for c in comps if c["name"].startswith("schedule-")]
    disp = [c["metrics"] for c in comps if c["name"].startswith("dispatch-")]
    others = [
        c["metrics"]
        for c in comps
        if c.get("metrics") and c["name"].startswith(("agent-", "clustermgr-"))
    ]
    pids = {c["name"]: c["pid"] for c in comps}
    scr: dict[str, list[ps.Scrape]] = {}
    scr["s0"], scr["d0"] = await ps.scrape_all(sched), await ps.scrape_all(disp)
    scr["o0"] = await ps.scrape_all(others)
    scr["s1"], scr["d1"], scr["o1"] = scr["s0"], scr["d0"], scr["o0"]
    profilers = prof.Profilers(opts.out / "profiles" / prefix) if opts.profile else None
    cpu: list[dict[str, float]] = []
    machine: list[dict[str, float]] = []
    runnable: list[dict[str, tuple[float, float]]] = []
    load_before = os.getloadavg()[0]

    async def on_line(line: str, loadgen_pid: int) -> None:
        if line == MEASURING:
            # Warmup is over: what the control plane did so far is not counted.
            cpu.append(prof.cpu_snapshot(pids))
            machine.append(prof.machine_cpu())
            runnable.append(_schedstats({**pids, "load_generator": loadgen_pid}))
            scr["s0"], scr["d0"] = await ps.scrape_all(sched), await ps.scrape_all(disp)
            scr["o0"] = await ps.scrape_all(others)
            if profilers is not None:
                profiled = {k: v for k, v in pids.items() if not k.startswith("clustermgr")}
                await profilers.start({**profiled, "loadgen": loadgen_pid})
        else:
            cpu.append(prof.cpu_snapshot(pids))
            machine.append(prof.machine_cpu())
            runnable.append(_schedstats({**pids, "load_generator": loadgen_pid}))
            scr["s1"], scr["d1"] = await ps.scrape_all(sched), await ps.scrape_all(disp)
            scr["o1"] = await ps.scrape_all(others)

    job = {
        "target": "galaxy",
        "address": endpoints["controller"],
        "mode": s.mode,
        "concurrency": s.concurrency,
        "functions": [f.name for f in wl.functions],
        "requests": wl.requests,
        "prime": wl.prime,
        "warmup": wl.warmup,
        "timeout_s": s.timeout_s,
        "max_duration_s": s.max_duration_s,
        "streams": s.dispatch_streams,
    }
    res = await run_loadgen(job, work, prefix, on_line)
    profile = await profilers.stop() if profilers is not None else None
    # The echo is measured before and after the plan: on a shared machine the
    # two differ, and their spread says how far to trust the ratios. The
    # plan's aftermath (idle instances deleted) is let pass first.
    settled_s = (
        await prof.settle(pids, SETTLED_CORES, SETTLE_MAX_S, quiet_s=SETTLE_QUIET_S)
        if opts.settle
        else None
    )
    echo_b = await _echo(bf, echo, s.concurrency, work, f"{prefix}-echo-after")
    echo_res = sm.merge_runs(echo_a[0], echo_b[0])
    out = sm.summarize_plan(plan, cp, s, wl, res, echo_res, scr)
    if s.mode == "open" and s.echo_same_rate:
        same = await _echo_same_rate(echo, wl, s, work, f"{prefix}-echo-same-rate")
        sm.add_same_rate_echo(out, same)
    out["loadavg"] = [load_before, os.getloadavg()[0]]
    out["settled_s"] = settled_s
    out["cpu_cores"] = sm.cores(cpu, res)
    out["gc_pauses"] = sm.gc_pauses(scr)
    if len(machine) >= 2:
        out["machine_cores"] = sm.machine_cores(machine[0], machine[-1], out["cpu_cores"])
        wall = machine[-1].get("at", 0.0) - machine[0].get("at", 0.0)
        if len(runnable) >= 2 and wall > 0:
            a, b = runnable[0], runnable[-1]
            both = [k for k in b if k in a]
            # Our processes runnable on average (running or waiting for a CPU).
            out["machine_cores"]["ours_runnable"] = sum(sum(b[k]) - sum(a[k]) for k in both) / wall
            # Share of the wall time each event loop had work but no CPU:
            # a request arriving then waits that long before it is read.
            out["run_queue_wait"] = {k: (b[k][1] - a[k][1]) / wall for k in both}
    e = out["baseline"]["echo"]
    e["cpu_cores"] = {k: (echo_a[1][k] + echo_b[1][k]) / 2 for k in echo_a[1]}
    e["requests_per_s_before"] = sm.div(echo_a[0]["ok"], echo_a[0]["duration_s"])
    e["requests_per_s_after"] = sm.div(echo_b[0]["ok"], echo_b[0]["duration_s"])
    sm.cpu_costs(out)
    if profile is not None:
        out["profile"] = profile
    return out


def _schedstats(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """(on CPU, waiting for one) seconds so far of each named process."""
    return {k: v for k, pid in pids.items() if (v := prof.schedstat(pid)) is not None}


async def _echo(
    bf: pl.BenchFile, echo: EchoProcess, concurrency: int, work: Path, name: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """The raw echo, closed loop at the plan's concurrency: (result, CPU cores)."""
    n = int(bf.load["echo_requests"])
    job = {
        "target": "echo",
        "address": echo.address,
        "mode": "closed",
        "concurrency": concurrency,
        "requests": [(0.0, 0, 0.0)] * n,
        "warmup": min(200, n // 10),
        "max_duration_s": float(bf.load["echo_max_s"]),
    }
    snaps: list[dict[str, float]] = []

    async def on_line(line: str, pid: int) -> None:
        snaps.append(prof.cpu_snapshot({"echo_server": echo.pid}))

    res = await run_loadgen(job, work, name, on_line)
    cores = sm.cores(snaps, res)
    cores.setdefault("echo_server", math.nan)
    return res, cores


async def _echo_same_rate(
    echo: EchoProcess, wl: pl.Workload, s: pl.LoadSettings, work: Path, name: str
) -> dict[str, Any]:
    """The raw echo sent the plan's own open-loop schedule (the same send
    times, warm-up and bound on requests in flight): what one plain RPC's
    latency is on this machine at that rate, the floor under the plan's."""
    job = {
        "target": "echo",
        "address": echo.address,
        "mode": "open",
        "concurrency": s.concurrency,
        "requests": [(t, 0, 0.0) for t, _, _ in wl.requests],
        "warmup": wl.warmup,
        "timeout_s": s.timeout_s,
        "max_duration_s": s.max_duration_s,
    }
    return await run_loadgen(job, work, name)


async def _deploy(controller: str, wl: pl.Workload) -> None:
    from controlplane.sdk.client import GalaxyClient

    sem = asyncio.Semaphore(_DEPLOY_CONCURRENCY)
    async with GalaxyClient(controller) as c:
        await c.put_runtime(servingruntime.emulated())

        async def one(spec: Any) -> None:
            async with sem:
                await c.deploy(spec)

        await asyncio.gather(*(one(f) for f in wl.functions))


async def _delete(controller: str, names: list[str]) -> None:
    from controlplane.sdk.client import GalaxyClient

    sem = asyncio.Semaphore(_DEPLOY_CONCURRENCY)
    async with GalaxyClient(controller) as c:

        async def one(name: str) -> None:
            async with sem:
                await c.delete_function(name)

        await asyncio.gather(*(one(n) for n in names))


async def run_loadgen(
    job: dict[str, Any],
    work: Path,
    name: str,
    on_line: Callable[[str, int], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run ``python -m controlplane.bench.loadgen`` on a job; returns its result."""
    work.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local, instant
    job_path, out_path, log_path = (work / f"{name}.{x}" for x in ("job.json", "out.json", "log"))
    # The generator pauses after announcing the measured phase until on_line
    # (the snapshot) is done: see controlplane.bench.loadgen.
    job_path.write_text(json.dumps({**job, "handshake": True}))
    with log_path.open("wb") as logf:
        proc = await procs.spawn(
            sys.executable,
            "-m",
            "controlplane.bench.loadgen",
            "--job",
            str(job_path),
            "--out",
            str(out_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logf,
        )
    assert proc.stdout is not None and proc.stdin is not None
    limit = float(job.get("max_duration_s", 120)) + float(job.get("timeout_s", 10)) + 120
    try:
        async with asyncio.timeout(limit):
            while line := await proc.stdout.readline():
                text = line.decode(errors="replace").strip()
                if text in (MEASURING, MEASURED) and on_line is not None:
                    await on_line(text, proc.pid)
                if text == MEASURING:
                    proc.stdin.write(b"go\n")  # 3 bytes into an empty pipe
            rc = await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"load generator {name} ran over {limit:.0f}s; see {log_path}") from None
    if rc != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"load generator {name} exited with {rc}; {log_path}:\n{tail}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    job_path.unlink()
    out_path.unlink()
    return result
