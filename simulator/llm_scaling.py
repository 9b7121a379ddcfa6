"""LLM autoscaling in simulated time: emulated engines started and drained by
the KPA (``functions.dispatch.autoscaling``) fed the chosen scaling signal
(``llmsignal``), on the Azure LLM inference 2023 conversation trace. The
same objects Dispatch uses decide; this module only moves time, routes by
least-request, and counts.

    python -m simulator.llm_scaling --minutes 20

Scale-down drains: only instances with nothing in flight are removed
(``idle_instances_to_remove``), so no stream is cut. Goodput counts the
requests meeting TTFT <= --ttft-ms and TPOT <= --tpot-ms, per second.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from controlplane.llm.engine import Engine, Profile, QueueFull, Request, Step
from controlplane.llm.profiles import profile
from controlplane.runtime.llmsignals import Load, Sample
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.llmsignal import ScalingSignal, fleet_value, kpa_config
from functions.dispatch.autoscaling.llmsignal import observed as pressured
from functions.dispatch.autoscaling.removal import InstanceView, idle_instances_to_remove
from simulator.traces import LLM_2023

CONV = LLM_2023 / "AzureLLMInferenceTrace_conv.csv"


@dataclass
class Inst:
    """One simulated instance."""

    name: str
    engine: Engine
    added: float
    ready_at: float
    inflight: int = 0
    step: Step | None = None
    removed: float | None = None


@dataclass
class Outcome:
    """One scaling policy's run."""

    label: str
    requests: int
    good: int
    duration_s: float
    instance_s: float
    #: instances started over the run (the first included)
    started: int
    ttfts: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """Requests within both SLOs per second."""
        return self.good / self.duration_s


def azure_conv(path: Path, minutes: float, speed: float = 1.0) -> list[tuple[float, int, int]]:
    """(arrival s, context tokens, generated tokens) of the trace's first
    minutes, arrival times divided by ``speed``."""
    rows: list[tuple[float, int, int]] = []
    t0: float | None = None
    with path.open() as f:
        for r in csv.DictReader(f):
            stamp, _, frac = r["TIMESTAMP"].partition(".")
            t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + float(f"0.{frac}")
            t0 = t if t0 is None else t0
            if t - t0 > minutes * 60:
                break
            rows.append(
                ((t - t0) / speed, int(r["ContextTokens"]), max(1, int(r["GeneratedTokens"])))
            )
    return rows


def run(
    jobs: list[tuple[float, int, int]],
    label: str,
    signal: ScalingSignal,
    prof: Profile,
    concurrency: int,
    slo: tuple[float, float],
    tick_s: float = 2.0,
) -> Outcome:
    """Replay ``jobs`` with the fleet scaled on ``signal``."""
    base = KpaConfig(target_concurrency=1.0, tick_s=tick_s, min_scale=1, max_scale=64)
    kpa = KpaAutoscaler(kpa_config(signal, base, concurrency))
    fleet: list[Inst] = [Inst("i0", Engine(prof), 0.0, 0.0)]
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    now = 0.0
    backlog: list[Request] = []
    recent_ttft: list[float] = []
    recent_tpot: list[float] = []
    arrivals = good = done = 0
    last_gen: dict[str, float] = {}
    ttfts: list[float] = []

    def push(t: float, kind: str, arg: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, arg))

    def kick(i: Inst) -> None:
        if i.step is None:
            i.step = i.engine.plan(now)
            if i.step is not None:
                push(i.step.ends, "step", i)

    def route(req: Request) -> None:
        ready = [i for i in fleet if i.removed is None and i.ready_at <= now]
        if not ready:
            backlog.append(req)
            return
        i = min(ready, key=lambda x: x.inflight)
        try:
            i.engine.submit(req)
        except (QueueFull, ValueError):
            return
        i.inflight += 1
        kick(i)

    for k, (t, ctx, gen) in enumerate(jobs):
        push(t, "arrive", Request(str(k), ctx, gen, arrived=t))
    push(tick_s, "tick", None)
    end_t = jobs[-1][0] if jobs else 0.0
    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "arrive":
            assert isinstance(arg, Request)
            arrivals += 1
            route(arg)
        elif kind == "ready":
            while backlog:
                route(backlog.pop(0))
        elif kind == "step":
            assert isinstance(arg, Inst)
            step, arg.step = arg.step, None
            assert step is not None
            for r in arg.engine.complete(step):
                if r.generated == 1 and r.first_token_at is not None:
                    ttfts.append(r.first_token_at - r.arrived)
                    recent_ttft.append(r.first_token_at - r.arrived)
                if r.finished_at is not None and r.first_token_at is not None:
                    arg.inflight -= 1
                    done += 1
                    ttft = r.first_token_at - r.arrived
                    tpot = (r.finished_at - r.first_token_at) / max(1, r.generated - 1)
                    recent_tpot.append(tpot)
                    good += int(ttft <= slo[0] and tpot <= slo[1])
            kick(arg)
        elif now <= end_t or any(i.inflight for i in fleet):  # a tick
            live = [i for i in fleet if i.removed is None]
            loads = []
            for i in live:
                made = float(i.engine.counters.generation_tokens)
                rate = (made - last_gen.get(i.name, made)) / tick_s
                last_gen[i.name] = made
                s = Sample(len(i.engine.waiting), len(i.engine.running), i.engine.kv_usage, made)
                loads.append(Load(i.name, now, s, rate))
            conc = float(sum(i.inflight for i in live) + len(backlog))
            value = fleet_value(signal, loads, conc, arrivals / tick_s)
            ttft_p = _p90(recent_ttft)
            tpot_p = _p90(recent_tpot)
            arrivals = 0
            recent_ttft.clear()
            recent_tpot.clear()
            ready = sum(1 for i in live if i.ready_at <= now)
            kpa.observe(now, pressured(signal, value, ttft_p, tpot_p, len(live) - ready))
            d = kpa.decide(now, ready, len(live) - ready)
            for _ in range(d.to_start):
                i = Inst(f"i{len(fleet)}", Engine(prof), now, now + prof.load_s)
                fleet.append(i)
                push(i.ready_at, "ready", None)
            views = [InstanceView(i.name, i.inflight, i.added) for i in live if i.ready_at <= now]
            for name in idle_instances_to_remove(views, d.to_remove):
                next(i for i in live if i.name == name).removed = now
            push(now + tick_s, "tick", None)
    inst_s = sum((i.removed if i.removed is not None else now) - i.added for i in fleet)
    started = len(fleet)
    return Outcome(label, len(jobs), good, max(end_t, 1e-9), inst_s, started, ttfts)


def _p90(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[int(0.9 * (len(s) - 1))]


def main(argv: list[str] | None = None) -> int:
    """Concurrency scaling against LLM signals; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m simulator.llm_scaling", description=__doc__)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--profile", default="llama2-13b-a100")
    ap.add_argument("--concurrency", type=int, default=8, help="the function's concurrency")
    ap.add_argument("--speed", type=float, default=1.0, help="time compression of the trace")
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    a = ap.parse_args(argv)
    if a.minutes <= 0 or a.speed <= 0 or a.concurrency < 1 or a.ttft_ms <= 0 or a.tpot_ms <= 0:
        ap.error("--minutes, --speed, --concurrency, --ttft-ms and --tpot-ms must be > 0")
    try:
        prof = profile(a.profile)
    except ValueError as e:
        ap.error(str(e))
    jobs = azure_conv(CONV, a.minutes, a.speed)
    slo = (a.ttft_ms / 1000, a.tpot_ms / 1000)
    slo_doc = {"ttft_ms": a.ttft_ms, "tpot_ms": a.tpot_ms}
    policies = [
        ("concurrency", ScalingSignal("concurrency")),
        ("queue + SLO", ScalingSignal.from_spec({"metric": "queue", **slo_doc})),
        ("kv + SLO", ScalingSignal.from_spec({"metric": "kv", **slo_doc})),
        ("tokens_per_s + SLO", ScalingSignal.from_spec({"metric": "tokens_per_s", **slo_doc})),
    ]
    outs = [run(jobs, lab, sig, prof, a.concurrency, slo) for lab, sig in policies]
    ref = outs[0]
    print(
        f"azure conv 2023: {len(jobs)} requests, {a.minutes:g} min at {a.speed:g}x, "
        f"profile {a.profile}"
    )
    print(
        "| scaling | goodput req/s | good % | instance-s | started | vs concurrency: goodput "
        "| instance-s |"
    )
    print("|---|---|---|---|---|---|---|")
    for o in outs:
        print(
            f"| {o.label} | {o.goodput:.2f} | {o.good / o.requests:.0%} | {o.instance_s:.0f} | "
            f"{o.started} | {o.goodput / ref.goodput:.2f}x | {o.instance_s / ref.instance_s:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
