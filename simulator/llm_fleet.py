"""LLM serving on a 210-node fleet in simulated time: many functions, each
its own model, replaying the Azure LLM inference 2023 trace
(``llm_fleet_workload``), with cold starts that load model weights from a
store or, faster, from a node's host-memory cache. Three policies:

* **galaxy**: the LLM picker (``controlplane.runtime.llmpicker``, queue + KV
  terms) on each function's owner, the KPA fed the queue signal with SLO
  pressure (``llmsignal``), and placement by ``model_locality``
  (``controlplane.runtime.scoring``), which prefers a node holding the
  model's weights;
* **knative**: the KPA on concurrency, a random pick among the function's
  ready instances, placement by ``least_loaded`` (no model locality);
* **llm-d**: the same picker scoring and scaling signal as galaxy, but one
  central router for every function, charged ``decision_ms`` per pick in a
  single queue, and placement by ``least_loaded`` (Kubernetes' scheduler
  knows nothing of cached weights).

A policy with ``max_asleep`` keeps instances a scale-in gives up asleep
(``controlplane.runtime.sleeppolicy``, the object Dispatch drives): an
asleep instance holds no GPU (its weights wait in its node's host memory,
as vLLM's sleep mode offloads them) and is not routed; a scale-out wakes
one in the profile's ``wake_s`` when its node has a GPU free (else it is
removed and a start places a new one), before any start.

The production objects decide (engine, picker, load book, KPA, signal,
removal, placement scoring); this module moves time, keeps the nodes' GPU
slots and weight caches, and counts. Everything is emulated, named so.

    python -m simulator.llm_fleet_cli            # 210 nodes, ~1 min per policy
    python -m simulator.llm_fleet_cli --quick    # 24 nodes, seconds
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import cast

from controlplane.llm.engine import Engine, Profile, QueueFull, Request
from controlplane.runtime.llmpicker import Ask, Candidate, ScoredPicker
from controlplane.runtime.llmsignals import Load, LoadBook, Sample
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import ModelLocality, NodeInfo, Placing, lookup
from controlplane.runtime.sleeppolicy import SleepPolicy, Step
from functions.dispatch.autoscaling.kpa import KpaAutoscaler, KpaConfig
from functions.dispatch.autoscaling.llmsignal import ScalingSignal, fleet_value, kpa_config
from functions.dispatch.autoscaling.llmsignal import observed as pressured
from functions.dispatch.autoscaling.removal import InstanceView, idle_instances_to_remove
from simulator.llm_fleet_workload import LARGE, FleetShape, Job
from simulator.llm_scaling import Inst as ScaledInst
from simulator.llm_scaling import p90

#: requests a function's router holds while none of its instances is ready
BACKLOG_BOUND = 5000


@dataclass(frozen=True)
class Policy:
    """One serving stack compared."""

    name: str
    #: "llm" (the scored picker) or "random"
    picker: str
    signal: ScalingSignal
    #: placement scoring term (``controlplane.runtime.scoring``)
    placement: str
    #: one router for every function (True) or one per function's owner
    central: bool
    #: instances a scale-in puts to sleep (0: removed), and for how long
    max_asleep: int = 0
    keep_asleep_s: float = 300.0


def policies(ttft_s: float, tpot_s: float, target: float) -> list[Policy]:
    """Galaxy, Knative-like and llm-d-like (module docstring); ``target``
    is the per-instance target of both scaling metrics."""
    slo = {"ttft_ms": ttft_s * 1000, "tpot_ms": tpot_s * 1000, "target": target}
    llm_signal = ScalingSignal.from_spec({"metric": "queue", **slo})
    conc = ScalingSignal("concurrency", target=target)
    return [
        Policy("galaxy", "llm", llm_signal, "model_locality", central=False),
        Policy("knative", "random", conc, "least_loaded", central=False),
        Policy("llm-d", "llm", llm_signal, "least_loaded", central=True),
    ]


@dataclass
class Inst(ScaledInst):
    """One instance of one function on one node."""

    function: int = 0
    node: int = 0
    #: when it fell asleep (None: awake or removed), and seconds spent asleep
    slept_at: float | None = None
    asleep_s: float = 0.0


@dataclass
class Fn:
    """One function's router and autoscaler state."""

    kpa: KpaAutoscaler
    picker: ScoredPicker | None
    book: LoadBook
    insts: list[Inst] = field(default_factory=list)
    backlog: deque[Request] = field(default_factory=deque)
    arrivals: int = 0
    recent_ttft: list[float] = field(default_factory=list)
    recent_tpot: list[float] = field(default_factory=list)
    last_gen: dict[str, float] = field(default_factory=dict)
    #: the sleeping instances (``Policy.max_asleep``), by name
    sleep: SleepPolicy | None = None
    asleep: dict[str, Inst] = field(default_factory=dict)


@dataclass
class Outcome:
    """One policy's run."""

    policy: str
    requests: int
    done: int
    refused: int
    good: int
    duration_s: float
    #: GPU-instance-seconds (an instance's GPUs from its start to its removal)
    gpu_s: float
    cold_loads: int
    warm_loads: int
    ttfts: list[float] = field(default_factory=list)
    #: sleeping instances woken instead of a start
    wakes: int = 0

    @property
    def goodput(self) -> float:
        """Requests within both SLOs per second of trace."""
        return self.good / self.duration_s

    def ttft_pct(self, q: float) -> float:
        """TTFT percentile q (0-100) of the finished requests, seconds."""
        if not self.ttfts:
            return float("nan")
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


class FleetSim:
    """One policy's run over one workload (see the module docstring)."""

    def __init__(
        self,
        policy: Policy,
        functions: int,
        prof: Profile = LARGE,
        shape: FleetShape | None = None,
        slo: tuple[float, float] = (1.0, 0.1),
        decision_s: float = 0.001,
        scrape_s: float = 0.5,
        tick_s: float = 2.0,
        seed: int = 1,
    ) -> None:
        shape = shape or FleetShape()
        self.policy, self.prof, self.shape, self.slo = policy, prof, shape, slo
        self.decision_s, self.scrape_s, self.tick_s = decision_s, scrape_s, tick_s
        self.rnd = random.Random(seed)
        self.now = 0.0
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        base = KpaConfig.knative_baseline(1.0, min_scale=0, max_scale=shape.nodes * 2)
        cfg = kpa_config(policy.signal, base, 1)
        self.fns = [
            Fn(
                KpaAutoscaler(cfg),
                ScoredPicker(clock=lambda: self.now) if policy.picker == "llm" else None,
                LoadBook(max_age_s=4 * scrape_s),
            )
            for _ in range(functions)
        ]
        for fn in self.fns if policy.max_asleep else ():
            fn.sleep = SleepPolicy(policy.keep_asleep_s, policy.max_asleep, lambda: self.now)
        cap = Res(gpus=shape.gpus_per_node)
        self.nodes = [NodeInfo(f"n{k}", f"n{k}", cap, models={}) for k in range(shape.nodes)]
        self._lru: list[OrderedDict[str, None]] = [OrderedDict() for _ in self.nodes]
        self._score = lookup(policy.placement)
        self._loading = ModelLocality(link_bps=shape.store_bps, memory_bps=shape.memory_bps)
        self._router_free: dict[int, float] = {}
        self.all: list[Inst] = []
        self.done = self.refused = self.good = self.cold = self.warm = self.wakes = 0
        self.ttfts: list[float] = []

    # -- events ---------------------------------------------------------
    def push(self, t: float, kind: str, arg: object) -> None:
        """Schedule an event."""
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, arg))

    def run(self, jobs: list[Job]) -> Outcome:
        """Replay ``jobs``; every request ends done or refused."""
        for k, job in enumerate(jobs):
            self.push(job.arrive, "arrive", k)
        self.push(0.0, "scrape", None)
        self.push(self.tick_s, "tick", None)
        end_t = jobs[-1].arrive if jobs else 0.0
        handlers = {
            "arrive": lambda a: self._arrive(jobs[cast(int, a)], cast(int, a)),
            "route": lambda a: self._route(*cast(tuple[int, Request], a)),
            "ready": self._ready,
            "step": self._stepped,
        }
        while self._events:
            self.now, _, kind, arg = heapq.heappop(self._events)
            if kind in handlers:
                handlers[kind](arg)
            elif self.now <= end_t or self._busy():
                scrape = kind == "scrape"
                (self._scrape if scrape else self._tick)()
                self.push(self.now + (self.scrape_s if scrape else self.tick_s), kind, None)
        gpu_s = sum(
            ((i.removed if i.removed is not None else self.now) - i.added - i.asleep_s)
            * self.shape.gpus_per_instance
            for i in self.all
        )
        gpu_s -= sum(
            (self.now - i.slept_at) * self.shape.gpus_per_instance
            for fn in self.fns
            for i in fn.asleep.values()
            if i.slept_at is not None
        )
        return Outcome(
            self.policy.name,
            len(jobs),
            self.done,
            self.refused,
            self.good,
            max(end_t, 1e-9),
            gpu_s,
            self.cold,
            self.warm,
            self.ttfts,
            self.wakes,
        )

    def _busy(self) -> bool:
        return any(f.backlog or any(i.inflight for i in f.insts) for f in self.fns)

    # -- requests -------------------------------------------------------
    def _arrive(self, job: Job, k: int) -> None:
        fn = self.fns[job.function]
        fn.arrivals += 1
        req = Request(str(k), job.prompt_tokens, job.max_tokens, arrived=self.now)
        if self.policy.picker != "llm":
            self._route(job.function, req)
            return
        # The pick costs decision_s on the router that makes it: one queue
        # per function's owner, or one for the whole fleet (central).
        router = -1 if self.policy.central else job.function
        at = max(self.now, self._router_free.get(router, 0.0)) + self.decision_s
        self._router_free[router] = at
        self.push(at, "route", (job.function, req))

    def _route(self, f: int, req: Request) -> None:
        fn = self.fns[f]
        ready = [i for i in fn.insts if i.ready_at <= self.now]
        if not ready:
            if len(fn.backlog) >= BACKLOG_BOUND:
                self.refused += 1
            else:
                fn.backlog.append(req)
            return
        if fn.picker is None:
            inst = self.rnd.choice(ready)
        else:
            cands = [Candidate(i.name, i.inflight, fn.book.get(i.name, self.now)) for i in ready]
            chosen = fn.picker.pick(cands, Ask())
            inst = next(i for i in ready if i.name == chosen)
        try:
            inst.engine.submit(req)
        except (QueueFull, ValueError):
            self.refused += 1
            return
        inst.inflight += 1
        self._kick(inst)

    def _kick(self, i: Inst) -> None:
        if i.step is None:
            i.step = i.engine.plan(self.now)
            if i.step is not None:
                self.push(i.step.ends, "step", i)

    def _stepped(self, arg: object) -> None:
        assert isinstance(arg, Inst)
        step, arg.step = arg.step, None
        assert step is not None
        fn = self.fns[arg.function]
        for r in arg.engine.complete(step):
            assert r.first_token_at is not None
            if r.generated == 1:
                fn.recent_ttft.append(r.first_token_at - r.arrived)
            if r.finished_at is not None:
                arg.inflight -= 1
                self.done += 1
                ttft = r.first_token_at - r.arrived
                tpot = (r.finished_at - r.first_token_at) / max(1, r.generated - 1)
                self.ttfts.append(ttft)
                fn.recent_tpot.append(tpot)
                self.good += int(ttft <= self.slo[0] and tpot <= self.slo[1])
        self._kick(arg)

    def _ready(self, arg: object) -> None:
        assert isinstance(arg, Inst)
        fn = self.fns[arg.function]
        if arg.removed is None:
            while fn.backlog:
                self._route(arg.function, fn.backlog.popleft())

    # -- signals and scaling --------------------------------------------
    def _scrape(self) -> None:
        for fn in self.fns:
            for i in fn.insts:
                if i.ready_at <= self.now:
                    e = i.engine
                    s = Sample(len(e.waiting), len(e.running), e.kv_usage)
                    fn.book.observe(i.name, s, self.now)

    def _tick(self) -> None:
        for f, fn in enumerate(self.fns):
            self._scale(f, fn)

    def _scale(self, f: int, fn: Fn) -> None:
        sig, now = self.policy.signal, self.now
        loads = []
        for i in fn.insts:
            made = float(i.engine.counters.generation_tokens)
            rate = (made - fn.last_gen.get(i.name, made)) / self.tick_s
            fn.last_gen[i.name] = made
            s = Sample(len(i.engine.waiting), len(i.engine.running), i.engine.kv_usage, made)
            loads.append(Load(i.name, now, s, rate))
        held = len(fn.backlog)
        conc = float(sum(i.inflight for i in fn.insts) + held)
        # Requests the router holds for want of an instance wait as surely
        # as those in an engine's queue: the queue metric counts them (else
        # a function scaled to zero would never see its load).
        value = fleet_value(sig, loads, conc, fn.arrivals / self.tick_s)
        value += held if sig.metric == "queue" else 0
        fn.arrivals = 0
        ttft_p, tpot_p = p90(fn.recent_ttft), p90(fn.recent_tpot)
        fn.recent_ttft.clear()
        fn.recent_tpot.clear()
        ready = sum(1 for i in fn.insts if i.ready_at <= now)
        starting = len(fn.insts) - ready
        fn.kpa.observe(now, pressured(sig, value, ttft_p, tpot_p, starting))
        d = fn.kpa.decide(now, ready, starting)
        for _ in range(d.to_start - self._wake(fn, d.to_start)):
            if not self._start(f, fn):
                break
        views = [InstanceView(i.name, i.inflight, i.added) for i in fn.insts if i.ready_at <= now]
        gone = set(idle_instances_to_remove(views, d.to_remove))
        for i in fn.insts:
            if i.name in gone:
                if fn.sleep is not None and fn.sleep.scale_in(i.name) is Step.SLEEP:
                    self._sleep(fn, i)
                else:
                    self._remove(fn, i)
        fn.insts = [i for i in fn.insts if i.removed is None and i.slept_at is None]
        for name in fn.sleep.expired() if fn.sleep is not None else ():
            i = fn.asleep.pop(name)
            i.asleep_s += now - (i.slept_at or now)
            i.slept_at, i.removed = None, now  # (its GPU went when it fell asleep)

    def _start(self, f: int, fn: Fn) -> bool:
        """Place one instance of function ``f``; False when no node has room."""
        need = Res(gpus=self.shape.gpus_per_instance)
        what = Placing(f"f{f}", f"model-{f}", self.shape.weights_bytes)
        best, best_score = -1, 0.0
        for k, node in enumerate(self.nodes):
            free = node.capacity - node.allocated
            if not need.fits_in(free):
                continue
            s = self._score(node, free, need, what)
            if best < 0 or s > best_score:
                best, best_score = k, s
        if best < 0:
            return False
        node = self.nodes[best]
        load_s = self._loading.load_s(node, what.model, what.model_bytes) + self.prof.load_s
        if node.models and what.model in node.models:
            self.warm += 1
        else:
            self.cold += 1
        self._cache(best, what.model)
        node.allocated = node.allocated + need
        i = Inst(
            f"f{f}.i{len(self.all)}",
            Engine(self.prof),
            self.now,
            self.now + load_s,
            function=f,
            node=best,
        )
        self.all.append(i)
        fn.insts.append(i)
        self.push(i.ready_at, "ready", i)
        return True

    def _sleep(self, fn: Fn, i: Inst) -> None:
        """Put an idle instance to sleep: its GPU is freed, it is not routed."""
        self._remove(fn, i)
        i.removed, i.slept_at = None, self.now
        fn.asleep[i.name] = i

    def _wake(self, fn: Fn, n: int) -> int:
        """Wake up to n sleeping instances (the policy's choice) whose node
        has a GPU free; one whose node has none is removed. Returns how many."""
        woken = 0
        for name in fn.sleep.wake(n) if fn.sleep is not None else ():
            i = fn.asleep.pop(name)
            assert i.slept_at is not None
            i.asleep_s += self.now - i.slept_at
            i.slept_at = None
            node, need = self.nodes[i.node], Res(gpus=self.shape.gpus_per_instance)
            if not need.fits_in(node.capacity - node.allocated):
                i.removed = self.now
                continue
            node.allocated = node.allocated + need
            i.engine.prefix.clear()  # (the KV cache went with the context)
            i.ready_at = self.now + self.prof.wake_s
            fn.insts.append(i)
            self.push(i.ready_at, "ready", i)
            woken += 1
        self.wakes += woken
        return woken

    def _cache(self, k: int, model: str) -> None:
        lru, models = self._lru[k], self.nodes[k].models
        assert isinstance(models, dict)
        lru[model] = None
        lru.move_to_end(model)
        models[model] = ("memory", self.shape.weights_bytes)
        while len(lru) > self.shape.cache_models:
            old, _ = lru.popitem(last=False)
            models.pop(old, None)

    def _remove(self, fn: Fn, i: Inst) -> None:
        i.removed = self.now
        node = self.nodes[i.node]
        node.allocated = node.allocated - Res(gpus=self.shape.gpus_per_instance)
        fn.book.forget(i.name)
        if fn.picker is not None:
            fn.picker.forget(i.name)
