"""``galaxy simulate-calibrate``: measure per-operation service times of the real
services on this machine.

Method: CPU seconds, not wall time, so that other load on a shared machine
moves the figures little. Start a real control plane with the bench runner
(``controlplane.bench.runner.run_bench``: `galaxy up` processes, emulated
nodes, the bench load generator in its own process; one instance of each
control function, both caches on, as Galaxy runs) and drive one kind of
work at a time in closed loop; read every process's CPU seconds
(/proc/<pid>/stat) over the measured phase and divide by the operations it
served:

- ``warm``: Dispatch + Release to warm functions -> Dispatch's cost of a
  request and its release (split evenly between ``dispatch.dispatch`` and
  ``dispatch.release``: the model charges both per request, so only their
  sum matters. Since 2026-11-26 (commit 35f1747) the generator, like the SDK, sends both as
  messages on one DispatchStream, a release riding on the next request;
  before, each was a unary RPC. Measuring Dispatch alone with held leases
  gave about the whole warm figure, which we could not explain, so we do
  not use it); and,
  since warm requests never touch them, the background CPU of ClusterMgr
  and the node agents = heartbeats (one per node per second), and of
  Schedule (``schedule.modnode``, per heartbeat: recorded, not charged,
  since how many ModNodes calls the beats cause depends on the outbox's
  batching, which the model performs; a call is charged
  ``schedule.modnodes`` = the echo's server CPU per unary call, plus
  ``schedule.upsert`` per status, timed in-process);
- ``cold``: every request cold-starts an instance -> per scale-up costs of
  Dispatch, Schedule (the Schedule RPC, the probes it sent per placement,
  one CreateInstance) and the node agents, background subtracted; and the
  policy's decision, as the median of the real Schedule's own scheduling
  latency (the median placement finds fresh candidates in the probe cache
  and sends no probe, so its span is the decision alone: about 3x the
  in-process timing of the same policy calls, which is the fallback); a
  credit's take, in a real Dispatch (credits on, at half the maximum rate).

The client and server side of one unary RPC come from a raw gRPC echo
(``controlplane.bench.echo``) timed from this process: client CPU per call
(the client side of a probe or CreateInstance), server CPU per call (an
agent's Probe), the extra CPU of a call on a new channel (the connection
cost), and the loopback one-way delay (the fastest batch's round trip minus
both sides' CPU, halved). The control instance start time is the time from
spawning a controller process until it is ready.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controlplane.runtime import procs
from simulator.calibrate_decisions import decide_cost, take_cost, take_ops
from simulator.calibration import OPS, Calibration, OpCost
from simulator.galaxy.streams import stream_costs

#: The cv given to every measured op: CPU accounting gives means only.
DEFAULT_CV = 0.5
_SCENARIOS: list[dict[str, Any]] = [
    {"name": "warm", "mode": "closed", "total_requests": 4000, "warmup_requests": 400,
     "cold_fraction": 0.0, "concurrency": 16},
    {"name": "cold", "mode": "closed", "total_requests": 2500, "warmup_requests": 250,
     "cold_fraction": 1.0, "concurrency": 32, "cold_functions": 256},
]  # fmt: skip


#: ``dispatch.credit_take``: cold starts at the maximum rate, then at half of
#: it; a take's tail differs between the two (``take_ops``).
_CREDIT_SCENARIOS: list[dict[str, Any]] = [
    _SCENARIOS[1],
    {"name": "half", "rate_of": {"scenario": "cold", "fraction": 0.5}, "total_requests": 2500,
     "warmup_requests": 250, "request_profile": {"distribution": "Poisson"},
     "cold_fraction": 1.0, "cold_functions": 256},
]  # fmt: skip


def bench_doc(nodes: int, quick: bool, credits: bool = False) -> dict[str, Any]:
    """The bench file the calibration runs (``credits``: the take's)."""
    scale = 0.3 if quick else 1.0
    scen = [
        {**s, "total_requests": int(s["total_requests"] * scale),
         "warmup_requests": int(s["warmup_requests"] * scale)}
        for s in (_CREDIT_SCENARIOS if credits else _SCENARIOS)
    ]  # fmt: skip
    # The Schedule path's costs with credits off (else most placements skip
    # Schedule); each plan deploys its own functions (257 and more a cold one).
    cp = {"nodes": nodes, "start_delay_ms": 0, "n": 1, "credits": credits, "max_functions": 1024}
    return {
        "name": "calibrate",
        "control_plane": cp,
        "load": {"seed": 1, "echo_requests": 1000, "echo_max_s": 1.0},
        "parameters": [{"name": "preset", "value": ["Galaxy"]}],
        "scenarios": scen,
    }


def _cpu(plan: dict[str, Any], prefix: str) -> float:
    """CPU seconds the processes named prefix* used in a plan's measured phase."""
    dur = plan["throughput"]["duration_s"]
    return sum(v for k, v in plan["cpu_cores"].items() if k.startswith(prefix)) * dur


def derive(
    plans: list[dict[str, Any]],
    echo: dict[str, float],
    nodes: int,
    decide: float,
    heartbeat_s: float = 1.0,
    upsert: float = 0.0,
    take: float = 0.0,
) -> dict[str, float]:
    """Per-op means from the bench plans and the echo figures."""
    by = {p["scenario"]: p for p in plans}
    warm = by["warm"]
    dw = warm["throughput"]["duration_s"]
    bg = {k: _cpu(warm, k) / dw for k in ("schedule", "clustermgr", "agent")}

    def per(scen: str, prefix: str, background: float = 0.0) -> float:
        p = by[scen]
        spent = _cpu(p, prefix) - background * p["throughput"]["duration_s"]
        return max(0.0, spent) / max(1, p["requests"]["ok"])

    beats = nodes / heartbeat_s
    d_only = per("warm", "dispatch") / 2
    client, server = echo["client_s"], echo["server_s"]
    cold = by["cold"]
    probes = cold["throughput"].get("probes_per_placement", 2.0)
    if math.isnan(probes):
        probes = 2.0
    measured = cold["latency_ms"]["scheduling"]["p50"] / 1000.0
    in_process = decide
    if not math.isnan(measured) and probes < 0.5:  # under a quarter of placements probe
        # The median placement did not probe: its span in the real Schedule
        # process is the policy's decision (in a busy process, about 3x the
        # in-process timing of the same calls).
        decide = measured
    agent_cold = per("cold", "agent", bg["agent"]) - probes * server
    rpcs = warm["throughput"]["rpcs_per_s"] * dw
    return {
        # Measured at the warm run's maximum rate, where the DispatchStream
        # batches deeply: a message's own work. A request that has its
        # stream to itself (a modest rate: galaxy simulate's independent
        # clients) also pays a read and a write (simulator.galaxy.streams).
        "dispatch.message": d_only,
        "dispatch.dispatch": d_only + client,
        "dispatch.release": d_only + client,
        # A cold request's Dispatch CPU covers its Dispatch and Release RPCs
        # (what a warm request costs, charged by the model to every request
        # as dispatch.dispatch + dispatch.release) and the scale-up: only the
        # rest is the scale-up's. Before commit 7c34ab7 one RPC (d_only) was
        # subtracted, which charged each simulated start one RPC twice.
        "dispatch.scale_up": max(1e-6, per("cold", "dispatch") - 2 * d_only),
        # A credit start's CreateInstance travels as a message on a batched
        # stream (simulator.galaxy.streams): the writes and reads are charged
        # per batch, so the per-message work is the unary call's less its
        # write and read (a unary client call: one write, one read).
        **stream_costs(per("cold", "dispatch") - 2 * d_only, max(1e-6, agent_cold), echo),
        "schedule.probe": client,
        "schedule.create": client,
        "schedule.schedule": max(
            1e-6, per("cold", "schedule", bg["schedule"]) - (probes + 1) * client - decide
        ),
        "schedule.decide": decide,
        # A credit's take, as inflated in a busy process as the policy's calls.
        "dispatch.credit_take": (take or in_process) * decide / in_process,
        # Per heartbeat, not charged: how many ModNodes calls the beats
        # caused is not known here (see "schedule.modnodes").
        "schedule.modnode": bg["schedule"] / beats,
        # A ModNodes call costs Schedule a unary call and its statuses one
        # upsert each; ClusterMgr, the client side of the call.
        "schedule.modnodes": server,
        "schedule.upsert": upsert,
        "clustermgr.modnodes": client,
        "agent.probe": server,
        "agent.create": max(1e-6, agent_cold),
        "agent.delete": max(1e-6, agent_cold),
        "agent.heartbeat": bg["agent"] / beats,
        "clustermgr.update": bg["clustermgr"] / beats,
        "client.rpc": _cpu(warm, "load_generator") / max(1.0, rpcs),
    }


def upsert_cost(nodes: int, rounds: int = 50) -> float:
    """CPU seconds of one status in a ModNodes call on Schedule, timed
    in-process (pure Python but for protobuf): parse it from a 64-status
    request, check it, the ownership test (rendezvous over 4 Schedule
    instances), ``node_info`` and ``PlacementPolicy.upsert`` of a status
    with a newer seq and a new allocation -- what ``ScheduleServicer.ModNodes``
    does per status. The call's own cost is ``schedule.modnodes``."""
    import random

    from controlplane.runtime.clock import ManualClock
    from controlplane.runtime.membership import MembershipView
    from controlplane.runtime.resources import Res
    from functions.schedule.policy import PlacementPolicy
    from functions.schedule.service import ScheduleServicer, node_info
    from galaxy.v1 import common_pb2, schedule_pb2

    schedule = common_pb2.CONTROL_KIND_SCHEDULE
    view = MembershipView()
    view.update(
        common_pb2.Membership(
            epoch=1,
            instances=[
                common_pb2.ControlInstance(id=f"s{i}", kind=schedule, address=f"h:{i}")
                for i in range(4)
            ],
        )
    )
    pol = PlacementPolicy("s0", clock=ManualClock(), rng=random.Random(1))
    ids = [f"n{i}" for i in range(nodes)]
    cap = Res(4000, 8192).to_proto()
    batch = 64
    bodies = []
    for r in range(rounds):
        changes = [
            schedule_pb2.ModNodeRequest(
                op=schedule_pb2.ModNodeRequest.OP_UPSERT,
                node=common_pb2.NodeStatus(
                    node_id=ids[(r * batch + k) % nodes],
                    address="a:1",
                    capacity=cap,
                    allocated=Res(10 * (r + 1), 16 * (r + 1)).to_proto(),
                    seq=r + 1,
                    instances=r + 1,
                ),
            )
            for k in range(batch)
        ]
        bodies.append(schedule_pb2.ModNodesRequest(changes=changes).SerializeToString())
    t0 = time.process_time()
    for body in bodies:
        req = schedule_pb2.ModNodesRequest.FromString(body)
        for i, c in enumerate(req.changes):
            ScheduleServicer._check_mod(c, f"changes[{i}].")
            # The ownership test's cost counts; every status is upserted
            # (a status for another partition would cost less).
            view.owner(schedule, c.node.node_id)
            pol.upsert(node_info(c.node))
    return (time.process_time() - t0) / (rounds * batch)


async def echo_round_trip(n: int = 2000, batches: int = 10) -> dict[str, float]:
    """Raw gRPC echo from this process: client and server CPU per call, the
    extra CPU of a call on a fresh channel, and the one-way delay (from the
    fastest batch of sequential calls: other load only ever adds)."""
    import grpc

    from controlplane.bench.echo import METHOD, EchoProcess
    from controlplane.bench.profile import cpu_seconds

    echo = EchoProcess()
    addr = await echo.start()
    payload = b"x" * 64

    def cpus() -> tuple[float, float]:
        return time.process_time(), cpu_seconds(echo.pid) or 0.0

    try:
        async with grpc.aio.insecure_channel(addr) as ch:
            call = ch.unary_unary(METHOD)
            for _ in range(200):
                await call(payload)
            c0, s0 = cpus()
            best = float("inf")
            for _ in range(batches):
                t0 = time.perf_counter()
                for _ in range(n // batches):
                    await call(payload)
                best = min(best, (time.perf_counter() - t0) / (n // batches))
            c1, s1 = cpus()
            # Calls spaced out, as a lightly loaded control plane makes them:
            # both ends go idle and each wake costs more than a busy hop.
            spaced = []
            _, s_sp = cpus()
            for _ in range(max(20, n // 20)):
                await asyncio.sleep(0.01)
                t0 = time.perf_counter()
                await call(payload)
                spaced.append(time.perf_counter() - t0)
            _, s_sp2 = cpus()
        fresh = max(20, n // 20)
        for _ in range(fresh):
            async with grpc.aio.insecure_channel(addr) as ch2:
                await ch2.unary_unary(METHOD)(payload)
        c2, s2 = cpus()
    finally:
        await echo.stop()
    client, server = (c1 - c0) / n, (s1 - s0) / n
    new = ((c2 - c1) + (s2 - s1)) / fresh
    return {
        "rtt_s": best,
        "client_s": client,
        "server_s": server,
        "hop_s": max(5e-6, (best - client - server) / 2),
        "connect_s": max(0.0, new - client - server),
        # Two wakes per spaced call: the server's for the request, ours for the reply.
        "wakeup_s": max(0.0, (statistics.median(spaced) - best) / 2),
        # The server's extra CPU for a request that finds it asleep.
        "wake_cpu_s": max(0.0, (s_sp2 - s_sp) / len(spaced) - server),
    }


async def loop_steps() -> dict[str, float]:
    """Event-loop iterations of a grpc.aio call (``controlplane.bench.loopsteps``,
    in a process of its own: it patches the loop class)."""
    # subprocess.run in a thread, not the loop's subprocess support (banned
    # where gRPC threads run: controlplane/runtime/procs.py says why).
    argv = [sys.executable, "-m", "controlplane.bench.loopsteps"]
    try:
        r = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise RuntimeError("counting event-loop iterations took over 120 s") from None
    if r.returncode != 0:
        raise RuntimeError(f"counting event-loop iterations failed: {r.stderr.decode()[-500:]}")
    doc = json.loads(r.stdout)
    return {"loop_request_steps": doc["request_steps"], "loop_reply_steps": doc["reply_steps"]}


async def control_start(tries: int = 3) -> float:
    """Median seconds from spawning a control process to it being ready.

    Plaintext (``--insecure``): this times the interpreter, imports and
    the server's start, not certificate loading (a few milliseconds). A
    process that exits before it is ready is an error, not a time."""
    from controlplane.runtime.host import READY_PREFIX

    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as errors:
            proc = await procs.spawn(
                sys.executable, "-m", "controlplane.tools.cli", "serve", "controller", "--listen",
                "127.0.0.1:0", "--metrics-listen", "", "--lifeline", "--insecure",
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            )  # fmt: skip
            assert proc.stdout is not None
            try:
                while True:
                    line = await asyncio.wait_for(proc.stdout.readline(), 60)
                    if not line:
                        await proc.wait()
                        errors.seek(0)
                        err = errors.read().decode(errors="replace")[-500:]
                        raise RuntimeError(f"the controller exited before it was ready: {err}")
                    if line.decode().startswith(READY_PREFIX):
                        break
                times.append(time.perf_counter() - t0)
            finally:
                await procs.terminate(proc, 10.0)
    return statistics.median(times)


def build(
    means: dict[str, float],
    echo: dict[str, float],
    start_s: float,
    meta: dict[str, Any],
    takes: tuple[dict[str, float], dict[str, float]] | None = None,
) -> Calibration:
    """A Calibration from the measured figures (``takes``: a credits-on run's
    half and maximum phases' credit decision buckets: the take measured in a
    real Dispatch, replacing the derived one; ``take_ops``)."""
    how = "galaxy simulate-calibrate (CPU seconds of the real processes)"
    src = {
        "dispatch.message": "warm: Dispatch CPU / request / 2 (request + release, as"
        " messages on DispatchStreams batched at the maximum rate)",
        "dispatch.dispatch": "dispatch.message + echo client CPU per unary call (its own"
        " read and write on its stream)",
        "dispatch.release": "dispatch.message + echo client CPU per unary call (its own"
        " read and write on its stream)",
        "dispatch.scale_up": "cold: Dispatch CPU / cold request - (dispatch.dispatch"
        " + dispatch.release)",
        "schedule.probe": "echo: client CPU per unary call",
        "schedule.create": "echo: client CPU per unary call",
        "schedule.schedule": "cold: Schedule CPU / placement - (probes per placement + 1)"
        " client calls - schedule.decide",
        "schedule.decide": "cold: median scheduling latency in the real Schedule (a"
        " placement without probes); else in-process timing of the policy calls",
        "dispatch.credit_take": "in-process timing of CreditWallet.take (median) x"
        " schedule.decide / in-process timing of the policy calls",
        "schedule.modnode": "warm: Schedule background CPU / heartbeats (not charged: the"
        " ModNodes calls per heartbeat depend on the outbox; see schedule.modnodes)",
        "schedule.modnodes": "echo: server CPU per unary call (a ModNodes call, its"
        " statuses excepted)",
        "schedule.upsert": "in-process timing of one status of a 64-status ModNodes"
        " request: parse, check, ownership, node_info, PlacementPolicy.upsert",
        "clustermgr.modnodes": "echo: client CPU per unary call (a ModNodes call made by"
        " ClusterMgr's outbox)",
        "agent.probe": "echo: server CPU per unary call",
        "agent.create": "cold: node agents' CPU / placement - probes per placement x agent.probe",
        "agent.delete": "= agent.create (not measured separately)",
        "agent.heartbeat": "warm: node agents' background CPU / heartbeats",
        "clustermgr.update": "warm: ClusterMgr CPU / heartbeats",
        "client.rpc": "warm: load generator CPU / RPC",
        "dispatch.stream_write": "echo: client CPU per unary call / 2 (a call is a write"
        " and a read)",
        "agent.stream_write": "echo: client CPU per unary call / 2 (a call is a write and a read)",
        "dispatch.credit_create": "dispatch.scale_up - echo client CPU per call (the"
        " unary call's write and read, charged per batch on the stream)",
        "agent.stream_create": "agent.create - echo server CPU per call (the unary"
        " call's read and write, charged per batch on the stream)",
    }
    ops = {k: OpCost(v, DEFAULT_CV, f"{how}; {src[k]}") for k, v in means.items()}
    if takes is not None:
        ops.update(take_ops(how, *takes, cv=DEFAULT_CV))
    params = {
        "connect_s": echo["connect_s"],
        "loopback_hop_s": echo["hop_s"],
        "control_start_s": start_s,
        "repartition_s": 0.03,
        "wakeup_s": echo["wakeup_s"],
        "wake_cpu_s": echo["wake_cpu_s"],
        "loop_request_steps": echo["loop_request_steps"],
        "loop_reply_steps": echo["loop_reply_steps"],
    }
    sources = {
        "connect_s": "echo: extra client + server CPU of a call on a fresh channel",
        "loopback_hop_s": "echo: (fastest batch's round trip - client CPU - server CPU) / 2",
        "control_start_s": "spawn of `galaxy serve controller` until it prints READY (median)",
        "repartition_s": "DESIGN.md section 1: adding one Schedule instance costs >= 30 ms",
        "wakeup_s": "echo: (median round trip of calls 10 ms apart - fastest batch's) / 2",
        "wake_cpu_s": "echo: server CPU per call 10 ms apart - per call back to back",
        "loop_request_steps": "python -m controlplane.bench.loopsteps: event-loop iterations"
        " from a call waking a grpc.aio server to its handler (median)",
        "loop_reply_steps": "python -m controlplane.bench.loopsteps: event-loop iterations"
        " from a reply waking the client to the caller resuming (median)",
    }
    assert set(OPS) <= set(ops)
    return Calibration(ops, params, {**meta, "echo": echo}, sources)


async def measure(nodes: int, quick: bool, log: Any = print, repeat: int = 1) -> Calibration:
    """Run everything (the bench part ``repeat`` times, taking each op's
    median); returns the calibration."""
    from controlplane.bench import plan as pl
    from controlplane.bench.runner import RunOptions, machine_info, run_bench

    echo = await echo_round_trip(500 if quick else 2000)
    echo.update(await loop_steps())
    decide = decide_cost(nodes, 5_000 if quick else 20_000)
    take = take_cost(takes=5_000 if quick else 20_000)
    upsert = upsert_cost(nodes, 20 if quick else 200)
    runs = []
    for i in range(repeat):
        with tempfile.TemporaryDirectory(prefix="galaxy-calibrate-") as tmp:
            bf = pl.parse(bench_doc(nodes, quick), Path(tmp) / "calibrate.yaml")
            res = await run_bench(bf, RunOptions(Path(tmp), Path(tmp), log=lambda s: log(s)))
        if res["failures"]:
            raise RuntimeError(f"calibration run {i + 1} failed: {res['failures']}")
        runs.append(derive(res["plans"], echo, nodes, decide, upsert=upsert, take=take))
    means = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    with tempfile.TemporaryDirectory(prefix="galaxy-calibrate-") as tmp:
        bf = pl.parse(bench_doc(nodes, quick, credits=True), Path(tmp) / "calibrate.yaml")
        res = await run_bench(bf, RunOptions(Path(tmp), Path(tmp), log=lambda s: log(s)))
    if res["failures"]:
        raise RuntimeError(f"calibration run with credits failed: {res['failures']}")
    half, busy = (next(p for p in res["plans"] if p["scenario"] == n) for n in ("half", "cold"))
    takes = (half.get("credit_decision_buckets", {}), busy.get("credit_decision_buckets", {}))
    start_s = await control_start(1 if quick else 3)
    meta = {
        "machine": json.dumps(machine_info()),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "method": "galaxy simulate-calibrate"
        + (" --quick" if quick else "")
        + f" (median of {repeat} runs)",
        "nodes": nodes,
    }
    return build(means, echo, start_s, meta, takes)


def save(cal: Calibration, path: Path) -> None:
    """Write a calibration file."""
    path.write_text(json.dumps(cal.to_json(), indent=1) + "\n")


async def main(args: Any) -> int:
    """``galaxy simulate-calibrate --out FILE``."""
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    cal = await measure(args.nodes, args.quick, log, repeat=args.repeat)
    save(cal, Path(args.out))
    for k, v in sorted(cal.ops.items()):
        print(f"{k:<20} {v.mean_s * 1e6:9.1f} us")
    for k, pv in sorted(cal.params.items()):
        if k.startswith("loop_"):
            print(f"{k:<20} {pv:9.0f} iterations")
        else:
            print(f"{k:<20} {pv * 1e3:9.3f} ms")
    print(f"wrote {args.out}")
    return 0
