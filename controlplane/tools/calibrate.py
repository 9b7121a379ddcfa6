"""`galaxy calibrate`: measure T_DF, T_SF and T_CMF on this machine.

T_x is the maximum throughput of one instance of a control function in its
critical operation: Dispatch requests/s, Schedule requests/s (SRPS), node
updates/s. The command starts a real control plane (``controlplane.launch.up``,
one instance of each kind, emulated nodes), drives each instance to
saturation with a closed-loop client (``--concurrency`` requests always in
flight) for ``--duration-s`` after a short warm-up, and writes the rates to
a JSON file the controller reads with ``--calibration`` (default
``~/.galaxy/calibration.json``). The client runs on the same machine, so the
figures are what this machine sustains end to end, client included.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from controlplane.controller.capacities import (  # noqa: F401 (re-exported)
    _FILE_KEYS,
    DEFAULT_T,
    calibrated_capacities,
    default_path,
)
from controlplane.runtime import servingruntime


async def closed_loop(
    call: Callable[[int], Awaitable[Any]], concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, float]:
    """Run ``call(i)`` from ``concurrency`` workers; count completions in the
    measured window only. Returns ops/s, completions, errors, seconds."""
    loop = asyncio.get_running_loop()
    seq = itertools.count()
    t_start = loop.time() + warmup_s
    t_end = t_start + duration_s
    done = errors = 0

    async def worker() -> None:
        nonlocal done, errors
        while loop.time() < t_end:
            try:
                await call(next(seq))
                ok = True
            except Exception:
                ok = False
            now = loop.time()
            if t_start <= now <= t_end:
                done += ok
                errors += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {
        "ops_per_second": done / duration_s,
        "ops": done,
        "errors": errors,
        "seconds": duration_s,
    }


async def _measure(
    endpoints: dict[str, Any], concurrency: int, warmup: float, dur: float
) -> dict[str, Any]:
    from controlplane.sdk.client import GalaxyClient
    from galaxy.v1 import (
        clustermgr_pb2_grpc,
        common_pb2,
        dispatch_pb2,
        dispatch_pb2_grpc,
        schedule_pb2,
        schedule_pb2_grpc,
    )

    comp = {c["name"]: c for c in endpoints["components"]}
    res = common_pb2.Resources(cpu_millis=1, memory_mib=1)
    out: dict[str, Any] = {}
    async with GalaxyClient(endpoints["controller"], timeout=30) as c:
        # Schedule: placements of tiny emulated instances, straight to the instance.
        spec = common_pb2.FunctionSpec(name="calib-sf", command=["x"], resources=res, concurrency=1)
        async with c.pool.stub(comp["schedule-0"]["address"], schedule_pb2_grpc.ScheduleStub) as s:

            async def place(i: int) -> None:
                await s.Schedule(
                    schedule_pb2.ScheduleRequest(instance_id=f"cal-{i}", function=spec)
                )

            out["schedule"] = await closed_loop(place, concurrency, warmup, dur)
        # Dispatch: warm dispatch + release against one instance with room.
        await c.put_runtime(servingruntime.emulated())
        await c.deploy(
            common_pb2.FunctionSpec(
                name="calib-df",
                runtime="emulated",
                resources=res,
                concurrency=100_000,
                max_scale=1,
            )
        )
        await c.release(await c.dispatch("calib-df"))  # cold-start it once
        async with c.pool.stub(comp["dispatch-0"]["address"], dispatch_pb2_grpc.DispatchStub) as d:

            async def dispatch(i: int) -> None:
                a = await d.Dispatch(dispatch_pb2.DispatchRequest(function="calib-df"))
                await d.Release(
                    dispatch_pb2.ReleaseRequest(function="calib-df", lease_id=a.lease_id)
                )

            out["dispatch"] = await closed_loop(dispatch, concurrency, warmup, dur)
        # ClusterMgr: heartbeats of nodes of its own (not the agents' nodes,
        # whose sequence numbers they own).
        addr = comp["clustermgr-0"]["address"]
        async with c.pool.stub(addr, clustermgr_pb2_grpc.ClusterMgrStub) as cm:
            n_nodes = 64

            def status(i: int) -> common_pb2.NodeStatus:
                return common_pb2.NodeStatus(
                    node_id=f"calib-node-{i % n_nodes}",
                    address="127.0.0.1:9",
                    capacity=common_pb2.Resources(cpu_millis=1000, memory_mib=1024),
                    seq=i + 1,
                )

            for i in range(n_nodes):
                await cm.RegisterNode(status(i))

            async def update(i: int) -> None:
                await cm.Update(status(n_nodes + i))

            out["clustermgr"] = await closed_loop(update, concurrency, warmup, dur)
    return out


async def calibrate(
    out_path: Path,
    *,
    nodes: int,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    cpu_limits: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Start a control plane, measure every kind, write and return the file's data."""
    from controlplane.launch.up import Supervisor
    from controlplane.launch.upconfig import UpConfig

    with tempfile.TemporaryDirectory(prefix="galaxy-calibrate-") as run_dir:
        sup = Supervisor(
            UpConfig.for_tool(
                nodes=nodes,
                sandbox="emulated",
                run_dir=Path(run_dir),
                node_cpu_millis=64_000,
                node_memory_mib=1 << 20,
                control_cpu_limit=[f"{k}={c}" for k, c in (cpu_limits or {}).items()],
            )
        )
        try:
            endpoints = await sup.start()
            await sup.wait_nodes_registered()
            measured = await _measure(endpoints, concurrency, warmup_s, duration_s)
        finally:
            await sup.stop()
    data = {
        "version": 1,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "method": {
            "nodes": nodes,
            "sandbox": "emulated",
            "concurrency": concurrency,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
            "cpu_limits": cpu_limits or {},
        },
        **{key: round(measured[kind]["ops_per_second"], 1) for kind, key in _FILE_KEYS.items()},
        "details": measured,
    }
    write_calibration(out_path, data)
    return data


def write_calibration(path: Path, data: dict[str, Any]) -> None:
    """Write the calibration file (small; written once at the end of a run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
