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
import random
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from controlplane.llm.engine import Engine, Profile, QueueFull, Request, Step
from controlplane.llm.profiles import profile
from controlplane.runtime.llmlatency import TPOT_BUCKETS, TTFT_BUCKETS, Histogram, LatencyWindow
from controlplane.runtime.llmsignals import Load, Sample
from functions.dispatch.admission import Admission, shed_demand
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.llmsignal import (
    LATENCY_WINDOW_S,
    ScalingSignal,
    fleet_value,
    kpa_config,
)
from functions.dispatch.autoscaling.llmsignal import observed as pressured
from functions.dispatch.autoscaling.removal import InstanceView, idle_instances_to_remove
from functions.dispatch.config import DispatchConfig
from functions.dispatch.llmroute import SCRAPE_S
from simulator.llm_fleet_workload import LARGE, LARGE_WEIGHTS_BYTES, FleetShape
from simulator.llm_scaling_fit import fit
from simulator.traces import LLM_2023

CONV = LLM_2023 / "AzureLLMInferenceTrace_conv.csv"
CODE = LLM_2023 / "AzureLLMInferenceTrace_code.csv"
#: the fleet simulation's large-model profile, by the name --profile takes
LARGE_NAME = "llama2-70b-4xa100"
#: Dispatch's queue bound per function (what admission's shares are of)
QUEUE_BOUND = DispatchConfig().max_queue


@dataclass
class Inst:
    """One simulated instance, with the latency histograms it exports."""

    name: str
    engine: Engine
    added: float
    ready_at: float
    inflight: int = 0
    step: Step | None = None
    removed: float | None = None
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))


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
    #: requests shed by admission, and per class: (sent, good)
    shed: int = 0
    by_class: dict[int, list[int]] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        """Requests within both SLOs per second."""
        return self.good / self.duration_s


@dataclass(frozen=True)
class Policy:
    """What one run scales on, and whether it sheds by class."""

    label: str
    signal: ScalingSignal
    admission: Admission | None = None


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


def classes(n: int, mix: tuple[float, float, float], seed: int = 1) -> list[int]:
    """A priority per request (critical 1, standard 0, sheddable -1) drawn
    with the shares ``mix`` (critical, standard, sheddable), seeded."""
    rng = random.Random(seed)
    return rng.choices((1, 0, -1), weights=mix, k=n)


def run(
    jobs: list[tuple[float, int, int]],
    label: str,
    signal: ScalingSignal,
    prof: Profile,
    concurrency: int,
    slo: tuple[float, float],
    tick_s: float = 2.0,
    *,
    admission: Admission | None = None,
    priorities: list[int] | None = None,
    max_scale: int = 64,
    scrape_s: float = SCRAPE_S,
) -> Outcome:
    """Replay ``jobs`` with the fleet scaled on ``signal`` (and, with
    ``admission``, requests shed by their class in ``priorities``). As in
    Dispatch, instances are scraped every ``scrape_s``: their queues and
    latency histograms feed a ``LatencyWindow`` whose p90 is the SLO
    pressure and whose first-token rate is admission's."""
    base = KpaConfig(target_concurrency=1.0, tick_s=tick_s, min_scale=1, max_scale=max_scale)
    kpa = KpaAutoscaler(kpa_config(signal, base, concurrency))
    window = LatencyWindow(LATENCY_WINDOW_S)
    fleet: list[Inst] = [Inst("i0", Engine(prof), 0.0, 0.0)]
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    now = 0.0
    backlog: list[Request] = []
    prio = priorities if priorities is not None else [0] * len(jobs)
    arrivals = good = shed = 0
    by_class: dict[int, list[int]] = {}
    prio_of: dict[str, int] = {}
    last_gen: dict[str, float] = {}
    ttfts: list[float] = []
    scraped_waiting = 0
    #: requests shed since the last tick: demand the autoscaler must still see
    shed_tick = 0

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

    def admit(req: Request, priority: int) -> bool:
        if admission is None:
            return True
        lat = window.latency(now)
        v = admission.decide(
            priority,
            ttft_s=signal.ttft_s,
            queued=scraped_waiting + len(backlog),
            first_tokens_per_s=lat.first_tokens_per_s,
            queue_bound=QUEUE_BOUND,
        )
        return v.admit

    for k, (t, ctx, gen) in enumerate(jobs):
        push(t, "arrive", (Request(str(k), ctx, gen, arrived=t), prio[k]))
        by_class.setdefault(prio[k], [0, 0])[0] += 1
    push(tick_s, "tick", None)
    push(scrape_s, "scrape", None)
    end_t = jobs[-1][0] if jobs else 0.0
    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "arrive":
            assert isinstance(arg, tuple)
            req, priority = arg
            arrivals += 1
            if admit(req, priority):
                prio_of[req.id] = priority
                route(req)
            else:
                shed += 1
                shed_tick += 1
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
                    arg.ttft.observe(r.first_token_at - r.arrived)
                if r.finished_at is not None and r.first_token_at is not None:
                    arg.inflight -= 1
                    ttft = r.first_token_at - r.arrived
                    tpot = (r.finished_at - r.first_token_at) / max(1, r.generated - 1)
                    if r.generated > 1:
                        arg.tpot.observe(tpot)
                    ok = ttft <= slo[0] and tpot <= slo[1]
                    good += int(ok)
                    by_class[prio_of.pop(r.id, 0)][1] += int(ok)
            kick(arg)
        elif kind == "scrape":
            live = [i for i in fleet if i.removed is None and i.ready_at <= now]
            scraped_waiting = sum(len(i.engine.waiting) for i in live)
            for i in live:
                window.observe(i.name, i.ttft.cumulative(), i.tpot.cumulative(), now)
            if now <= end_t or any(i.inflight for i in fleet):
                push(now + scrape_s, "scrape", None)
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
            value = value + len(backlog) if signal.metric == "queue" else value
            value = shed_demand(signal, value, shed_tick)
            shed_tick = 0
            lat = window.latency(now)
            arrivals = 0
            ready = sum(1 for i in live if i.ready_at <= now)
            queued = scraped_waiting + len(backlog)
            v = pressured(signal, value, lat.ttft_s, lat.tpot_s, len(live) - ready, queued)
            kpa.observe(now, v)
            d = kpa.decide(now, ready, len(live) - ready)
            for _ in range(d.to_start):
                i = Inst(f"i{len(fleet)}", Engine(prof), now, now + prof.load_s)
                fleet.append(i)
                push(i.ready_at, "ready", None)
            views = [InstanceView(i.name, i.inflight, i.added) for i in live if i.ready_at <= now]
            for name in idle_instances_to_remove(views, d.to_remove):
                gone = next(i for i in live if i.name == name)
                gone.removed = now
                window.forget(name)
            push(now + tick_s, "tick", None)
    inst_s = sum((i.removed if i.removed is not None else now) - i.added for i in fleet)
    return Outcome(
        label, len(jobs), good, max(end_t, 1e-9), inst_s, len(fleet), ttfts, shed, by_class
    )


def p90(xs: list[float]) -> float | None:
    """The 90th percentile of xs (None when empty): the per-tick reading
    ``simulator.llm_fleet`` still uses (this module reads ``LatencyWindow``)."""
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
    ap.add_argument("--max-scale", type=int, default=64, help="instances at most")
    ap.add_argument(
        "--classes",
        default="",
        metavar="C,S,X",
        help="shares of critical, standard and sheddable requests (e.g. 0.2,0.5,0.3): adds "
        "a run with SLO-class admission per signal",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the classes' draw")
    a = ap.parse_args(argv)
    if a.minutes <= 0 or a.speed <= 0 or a.concurrency < 1 or a.ttft_ms <= 0 or a.tpot_ms <= 0:
        ap.error("--minutes, --speed, --concurrency, --ttft-ms and --tpot-ms must be > 0")
    if a.max_scale < 1:
        ap.error("--max-scale must be >= 1")
    mix: tuple[float, float, float] | None = None
    if a.classes:
        try:
            c, st, x = (float(v) for v in a.classes.split(","))
        except ValueError:
            ap.error("--classes: three shares, e.g. 0.2,0.5,0.3")
        if min(c, st, x) < 0 or c + st + x <= 0:
            ap.error("--classes: shares >= 0, not all 0")
        mix = (c, st, x)
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
    targets = {"concurrency": 0.0, "queue": 0.0, "kv": 0.0, "tokens_per_s": 0.0}
    conc = a.concurrency
    if a.fit:
        f = fit(jobs, prof, slo)
        conc = f.concurrency
        targets = {"concurrency": 0.0, "queue": f.queue, "kv": min(1.0, f.kv),
                   "tokens_per_s": f.tokens_per_s}  # fmt: skip
        print(
            f"fitted per instance: concurrency {f.concurrency}, queue {f.queue:.1f}, "
            f"kv {f.kv:.2f}, tokens/s {f.tokens_per_s:.0f}"
        )
    policies = [Policy("concurrency", ScalingSignal("concurrency"))]
    for m in ("concurrency", "queue", "kv", "tokens_per_s"):
        sig = ScalingSignal.from_spec({"metric": m, "target": targets[m], **slo_doc})
        policies.append(Policy(f"{m} + SLO", sig))
    if mix is not None:
        policies += [dataclasses.replace(p, label=p.label + " + admission", admission=Admission())
                     for p in policies]  # fmt: skip
    prios = classes(len(jobs), mix, a.seed) if mix is not None else None
    extra = {"priorities": prios, "max_scale": a.max_scale}
    outs = [run(jobs, p.label, p.signal, prof, conc, slo, admission=p.admission, **extra)
            for p in policies]  # fmt: skip
    print(
        f"azure {a.trace} 2023: {len(jobs)} requests, {a.minutes:g} min at {a.speed:g}x, "
        f"profile {a.profile}, at most {a.max_scale} instances"
        + (f", classes critical/standard/sheddable {a.classes}" if mix is not None else "")
    )
    print(table(outs))
    return 0


def table(outs: list[Outcome]) -> str:
    """The markdown table of runs, each against the first (the baseline)."""
    ref = outs[0]
    rows = [
        "| scaling | goodput req/s | good % | critical good % | shed % | instance-s | started "
        "| vs first: goodput | instance-s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outs:
        sent, ok = o.by_class.get(1, [0, 0])
        crit = f"{ok / sent:.0%}" if sent else "-"
        rows.append(
            f"| {o.label} | {o.goodput:.2f} | {o.good / o.requests:.0%} | {crit} | "
            f"{o.shed / o.requests:.0%} | {o.instance_s:.0f} | {o.started} | "
            f"{o.goodput / ref.goodput:.2f}x | {o.instance_s / ref.instance_s:.2f}x |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
