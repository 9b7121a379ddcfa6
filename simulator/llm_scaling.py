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
import dataclasses
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
from simulator.llm_fleet_workload import LARGE, LARGE_WEIGHTS_BYTES, FleetShape
from simulator.traces import LLM_2023

CONV = LLM_2023 / "AzureLLMInferenceTrace_conv.csv"
CODE = LLM_2023 / "AzureLLMInferenceTrace_code.csv"
#: the fleet simulation's large-model profile, by the name --profile takes
LARGE_NAME = "llama2-70b-4xa100"
#: candidate per-instance concurrencies ``fit`` tries, smallest first
FIT_LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


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
            ttft_p = p90(recent_ttft)
            tpot_p = p90(recent_tpot)
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


@dataclass(frozen=True)
class Fit:
    """One engine's capacity on a request mix at the SLO, and what each
    metric reads there: the per-instance targets ``fit`` derives."""

    concurrency: int
    queue: float
    kv: float
    tokens_per_s: float


def _closed_loop(
    mix: list[tuple[float, int, int]],
    prof: Profile,
    level: int,
    slo: tuple[float, float],
    finishes: int,
) -> tuple[float, float, float, float]:
    """One engine kept at ``level`` requests in flight (drawn from ``mix`` in
    turn) until ``finishes`` finish: the fraction within both SLOs, and the
    mean queue, KV use and generated tokens/s over time."""
    e = Engine(prof)
    now, k, good, done = 0.0, 0, 0, 0
    area_q = area_kv = 0.0

    def submit() -> None:
        nonlocal k
        _, ctx, gen = mix[k % len(mix)]
        k += 1
        e.submit(Request(str(k), min(ctx, prof.kv_capacity_tokens // 2), gen, arrived=now))

    for _ in range(level):
        submit()
    while done < finishes:
        step = e.plan(now)
        assert step is not None  # never idle: a finish is replaced at once
        area_q += (len(e.waiting) + len(e.running)) * step.duration
        area_kv += e.kv_usage * step.duration
        now = step.ends
        for r in e.complete(step):
            if r.finished_at is not None and r.first_token_at is not None:
                ttft = r.first_token_at - r.arrived
                tpot = (r.finished_at - r.first_token_at) / max(1, r.generated - 1)
                good += int(ttft <= slo[0] and tpot <= slo[1])
                done += 1
                submit()
    return good / done, area_q / now, area_kv / now, e.counters.generation_tokens / now


def fit(
    mix: list[tuple[float, int, int]],
    prof: Profile,
    slo: tuple[float, float],
    finishes: int = 400,
    keep: float = 0.9,
) -> Fit:
    """Per-instance targets fitted to the emulated engine: the largest
    concurrency (of ``FIT_LEVELS``) at which one engine, kept that busy with
    this mix, still serves at least ``keep`` of the share within both SLOs
    it serves alone (some prompts miss the TTFT target even alone), and the
    queue, KV use and tokens/s it shows there. Every metric, concurrency
    included, is then aimed at the same operating point, so none is
    favoured by a default that suits another profile."""
    alone, q, kv, rate = _closed_loop(mix, prof, 1, slo, finishes)
    best = Fit(1, q, kv, rate)
    for level in FIT_LEVELS[1:]:
        if level > prof.max_running:
            break
        share, q, kv, rate = _closed_loop(mix, prof, level, slo, finishes)
        if share < keep * alone:
            break
        best = Fit(level, q, kv, rate)
    return best


def p90(xs: list[float]) -> float | None:
    """The 90th percentile of xs (None when empty): what the SLO pressure reads."""
    if not xs:
        return None
    s = sorted(xs)
    return s[int(0.9 * (len(s) - 1))]


def main(argv: list[str] | None = None) -> int:
    """Concurrency scaling against LLM signals; prints a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m simulator.llm_scaling", description=__doc__)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--profile", default="llama2-13b-a100")
    ap.add_argument("--trace", choices=("conv", "code"), default="conv")
    ap.add_argument("--concurrency", type=int, default=8, help="the function's concurrency")
    ap.add_argument(
        "--fit",
        action="store_true",
        help="targets of every metric (concurrency included) fitted to the profile's capacity",
    )
    ap.add_argument("--speed", type=float, default=1.0, help="time compression of the trace")
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    a = ap.parse_args(argv)
    if a.minutes <= 0 or a.speed <= 0 or a.concurrency < 1 or a.ttft_ms <= 0 or a.tpot_ms <= 0:
        ap.error("--minutes, --speed, --concurrency, --ttft-ms and --tpot-ms must be > 0")
    try:
        # The large profile's load_s is its engine start only (the fleet
        # simulation adds the weights' load by node): here every start
        # reads the weights from the model store.
        cold = LARGE.load_s + LARGE_WEIGHTS_BYTES / FleetShape().store_bps
        prof = (
            dataclasses.replace(LARGE, load_s=cold)
            if a.profile == LARGE_NAME
            else profile(a.profile)
        )
    except ValueError as e:
        ap.error(f"{e} (or {LARGE_NAME})")
    jobs = azure_conv(CODE if a.trace == "code" else CONV, a.minutes, a.speed)
    slo = (a.ttft_ms / 1000, a.tpot_ms / 1000)
    slo_doc = {"ttft_ms": a.ttft_ms, "tpot_ms": a.tpot_ms}
    targets = {"queue": 0.0, "kv": 0.0, "tokens_per_s": 0.0}
    conc = a.concurrency
    if a.fit:
        f = fit(jobs, prof, slo)
        conc = f.concurrency
        targets = {"queue": f.queue, "kv": min(1.0, f.kv), "tokens_per_s": f.tokens_per_s}
        print(
            f"fitted per instance: concurrency {f.concurrency}, queue {f.queue:.1f}, "
            f"kv {f.kv:.2f}, tokens/s {f.tokens_per_s:.0f}"
        )
    policies = [("concurrency", ScalingSignal("concurrency"))] + [
        (
            f"{m} + SLO",
            ScalingSignal.from_spec({"metric": m, "target": targets[m], **slo_doc}),
        )
        for m in ("queue", "kv", "tokens_per_s")
    ]
    outs = [run(jobs, lab, sig, prof, conc, slo) for lab, sig in policies]
    ref = outs[0]
    print(
        f"azure {a.trace} 2023: {len(jobs)} requests, {a.minutes:g} min at {a.speed:g}x, "
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
