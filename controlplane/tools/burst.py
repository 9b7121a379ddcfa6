"""A cold-start burst against a running control plane, to watch the
controller scale Schedule (the issue's done-when experiment).

    python -m controlplane.tools.burst --nodes 210 --t-sf 150

starts ``galaxy up --nodes 210 --sandbox emulated --autoscale-control`` (in
this process, as real child processes), deploys ``--functions`` functions
with concurrency 1, and runs ``--concurrency`` closed-loop clients that each
dispatch without releasing: every request is a cold start, so every request
is one Schedule request. It samples the controller's status every half
second and reports the achieved scale-up rate (cold starts/s) before the
first added Schedule instance took traffic and after the last one did, the
time from overload to the new instance taking traffic, and how the
instances come back down once the burst stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.runtime import authn, servingruntime, validation
from controlplane.runtime.tls import TlsConfig
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc

SCHEDULE = common_pb2.CONTROL_KIND_SCHEDULE


@dataclass
class Sample:
    """One status sample: time since start, Schedule instances, cold starts so far."""

    t: float
    instances: int
    warming: int
    draining: int
    load: float
    cold_starts: int


@dataclass
class BurstResult:
    """What a burst run measured."""

    samples: list[Sample] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    cold_starts: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    burst_s: float = 0.0
    started_unix: float = 0.0

    def rate(self, t0: float, t1: float) -> float:
        """Cold starts per second between two sample times."""
        pts = [s for s in self.samples if t0 <= s.t <= t1]
        if len(pts) < 2 or pts[-1].t <= pts[0].t:
            return 0.0
        return (pts[-1].cold_starts - pts[0].cold_starts) / (pts[-1].t - pts[0].t)


def spec(name: str) -> common_pb2.FunctionSpec:
    """A tiny emulated function: one request per instance, room for many."""
    return common_pb2.FunctionSpec(
        name=name,
        runtime=servingruntime.emulated().name,
        concurrency=1,
        # The cluster's default bound (controller --max-instances-per-function).
        max_scale=validation.MAX_INSTANCES_PER_FUNCTION_DEFAULT,
        resources=common_pb2.Resources(cpu_millis=1, memory_mib=1),
    )


async def burst(
    controller: str,
    *,
    functions: int,
    concurrency: int,
    burst_s: float,
    tail_s: float,
    sample_s: float = 0.5,
    settle: Any = None,
    tail_rate: float = 0.0,
    tls: TlsConfig | None = None,
    token: str | None = None,
) -> BurstResult:
    """Run the burst and sample the status; see the module docstring.

    settle(result) -> bool, if given, ends the tail early once true.
    tail_rate: cold starts per second kept up after the burst (so instances
    are drained and removed while requests still flow). tls: the client
    certificate when the control plane serves mutual TLS; token: the bearer
    token when it checks tokens.
    """
    res = BurstResult(burst_s=burst_s)
    names = [f"burst-{i}" for i in range(functions)]
    loop = asyncio.get_running_loop()
    async with GalaxyClient(controller, timeout=30, tls=tls, token=token) as c:
        await c.put_runtime(servingruntime.emulated())
        for n in names:
            await c.deploy(spec(n))
        await c.refresh_membership()
        t_start = loop.time()
        res.started_unix = time.time()
        stop_at = t_start + burst_s

        done = asyncio.Event()

        async def one(fn: str) -> None:
            owner = c.membership.owner(common_pb2.CONTROL_KIND_DISPATCH, fn)
            if owner is None:
                await c.refresh_membership()
                return
            try:
                async with c.pool.stub(owner.address, dispatch_pb2_grpc.DispatchStub) as s:
                    r = await s.Dispatch(
                        dispatch_pb2.DispatchRequest(function=fn),
                        timeout=30,
                        metadata=authn.token_metadata(token),
                    )
                res.cold_starts += r.cold_start
            except Exception as e:
                res.errors += 1
                if len(res.error_messages) < 5:
                    res.error_messages.append(repr(e))

        async def tail() -> None:
            await asyncio.sleep(max(0.0, stop_at - loop.time()))  # until the burst ends
            i, pending = 0, set()
            while tail_rate > 0 and not done.is_set():
                t = asyncio.ensure_future(one(names[i % len(names)]))
                pending.add(t)
                t.add_done_callback(pending.discard)
                i += 1
                await asyncio.sleep(1.0 / tail_rate)  # an open-loop arrival rate
            await asyncio.gather(*pending)

        async def worker(k: int) -> None:
            i = k
            while loop.time() < stop_at:
                await one(names[i % len(names)])
                i += concurrency

        async def sampler() -> None:
            while True:
                await c.refresh_membership()  # Dispatch instances may change too
                st = await c.status()
                sk = next((k for k in st.scaling if k.kind == SCHEDULE), None)
                if sk is not None:
                    res.samples.append(
                        Sample(
                            loop.time() - t_start,
                            sk.instances,
                            sk.warming,
                            sk.draining,
                            sk.load,
                            res.cold_starts,
                        )
                    )
                    res.decisions = [
                        {
                            "from": d.from_instances,
                            "to": d.to_instances,
                            "code": d.code,
                            "outcome": d.outcome,
                            "at": d.decided_at_unix,
                            "detect_s": round(d.detect_s, 3),
                            "duration_s": round(d.duration_s, 3),
                            "reason": d.reason,
                        }
                        for d in reversed(sk.decisions)
                    ]
                if loop.time() > stop_at and settle is not None and settle(res):
                    break
                if loop.time() > stop_at + tail_s:
                    break
                await asyncio.sleep(sample_s)  # a sampling period
            done.set()

        await asyncio.gather(sampler(), tail(), *(worker(k) for k in range(concurrency)))
    return res


def summarize(res: BurstResult) -> dict[str, Any]:
    """Before/after rates and the scale-out timings of a burst."""
    outs = [d for d in res.decisions if d["to"] > d["from"] and d["outcome"] == "done"]
    ins = [d for d in res.decisions if d["to"] < d["from"]]
    out: dict[str, Any] = {
        "cold_starts": res.cold_starts,
        "errors": res.errors,
        "max_schedule_instances": max((s.instances for s in res.samples), default=0),
        "final_schedule_instances": res.samples[-1].instances if res.samples else 0,
        "scale_outs": outs,
        "scale_ins": ins,
    }
    if outs:
        # Before: from the first second (clients ramped up) until the first
        # new instance took traffic. After: from a second after the last one
        # took traffic until the burst ended.
        first_ready = outs[0]["at"] - res.started_unix + outs[0]["duration_s"]
        last_ready = outs[-1]["at"] - res.started_unix + outs[-1]["duration_s"]
        out["rate_before_per_s"] = round(res.rate(1.0, first_ready), 1)
        out["rate_after_per_s"] = round(res.rate(last_ready + 1.0, res.burst_s), 1)
        # The burst is the overload: from its start until the first new
        # instance took traffic (report interval + tick + start + warm-up).
        out["burst_start_to_decision_s"] = round(outs[0]["at"] - res.started_unix, 3)
        out["decision_to_traffic_s"] = outs[0]["duration_s"]
        out["overload_to_traffic_s"] = round(first_ready, 3)
    out["error_messages"] = res.error_messages
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Start the control plane, run the burst, stop it; the summary."""
    from controlplane.launch.up import Supervisor
    from controlplane.launch.upconfig import UpConfig

    flags = ["--scale-in-cooldown-s", str(args.scale_in_cooldown_s)]
    flags += ["--max-instances", f"schedule={args.max_schedule}"]
    if args.t_sf:
        flags += ["--t-sf", str(args.t_sf)]
    if args.calibration:
        flags += ["--calibration", args.calibration]
    with tempfile.TemporaryDirectory(prefix="galaxy-burst-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp)
        sup = Supervisor(
            UpConfig.for_tool(
                nodes=args.nodes,
                sandbox="emulated",
                run_dir=run_dir,
                autoscale_control=True,
                controller_args=flags,
                probe_cache=not args.no_probe_cache,
                control_cpu_limit=args.cpu_limit,
            )
        )
        try:
            endpoints = await sup.start()
            await sup.wait_nodes_registered()
            res = await burst(
                endpoints["controller"],
                functions=args.functions,
                concurrency=args.concurrency,
                burst_s=args.burst_s,
                tail_s=args.tail_s,
                settle=lambda r: bool(r.samples) and r.samples[-1].instances == 1,
            )
        finally:
            await sup.stop()
    summary = summarize(res)
    summary["samples"] = [s.__dict__ for s in res.samples]
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the burst and print a JSON summary."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=210)
    p.add_argument("--t-sf", type=float, default=None, help="T_SF the controller is told")
    p.add_argument("--calibration", default=None, help="T values from `galaxy calibrate`")
    p.add_argument("--functions", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--burst-s", type=float, default=20.0)
    p.add_argument("--tail-s", type=float, default=30.0)
    p.add_argument("--scale-in-cooldown-s", type=float, default=3.0)
    p.add_argument("--max-schedule", type=int, default=4)
    p.add_argument("--no-probe-cache", action="store_true")
    p.add_argument(
        "--cpu-limit", action="append", default=[], help="[KIND=]CPUS per control function"
    )
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--run-dir", default=None, help="keep the logs here (default: a temp dir)")
    args = p.parse_args(argv)
    from controlplane.runtime.host import install_uvloop

    install_uvloop()
    summary = asyncio.run(main_async(args))
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
