"""Pick the instance for an LLM request: a weighted sum of scoring terms
(queue depth, KV-cache use, prefix-cache affinity, adapter affinity), each
registered by name like placement's terms (``controlplane.runtime.scoring``),
plus the baselines it is compared with (least-request, round-robin).

Pure: no I/O; the clock is injected (it ages the approximate prefix index).
The gateway and the simulator (``simulator.llm_routing``) drive the same
objects. One picker serves one function and lives where that function's
requests are routed (the function's owner decides, as for leases), so no
index is shared between routers.

Prefix affinity comes in two kinds:

* ``prefix`` (approximate): the picker remembers which instances it sent
  each leading block hash of a prompt (LRU, bounded, aged out after
  ``index_ttl_s``); a candidate scores the fraction of the prompt's leading
  blocks it was sent.
* ``prefix_precise``: the blocks the instance itself reports
  (``signals.Sample.blocks``); the fraction of leading blocks it holds.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.runtime.llmsignals import Load


@dataclass(frozen=True)
class Ask:
    """What the picker knows of a request."""

    #: chained hashes of the prompt's leading full blocks (engine.block_hashes)
    blocks: tuple[str, ...] = ()
    adapter: str = ""


@dataclass(frozen=True)
class Candidate:
    """One instance the request may go to."""

    instance: str
    #: the router's own count of requests sent and not yet finished
    inflight: int = 0
    #: the last scraped signals; None when none is fresh
    load: Load | None = None

    @property
    def queue(self) -> int:
        """Queue depth: the scraped waiting count plus the router's in-flight
        count (fresher than a scrape, so a burst between scrapes spreads)."""
        waiting = self.load.sample.waiting if self.load is not None else 0
        return waiting + self.inflight


@dataclass
class View:
    """Facts shared by the terms for one pick."""

    ask: Ask
    candidates: Sequence[Candidate]
    #: instance -> how many leading blocks the approximate index says it has
    approx_hits: Mapping[str, int]
    max_queue: int = 0
    min_queue: int = 0
    #: the mean kv term of the candidates that report KV use (0.5: none does)
    kv_known: float = 0.5


#: A term scores one candidate in [0, 1], higher is better.
Term = Callable[[Candidate, View], float]
TERMS: dict[str, Term] = {}


def register(name: str) -> Callable[[Term], Term]:
    """Decorator: make ``fn`` the picker term called ``name``."""

    def add(fn: Term) -> Term:
        if name in TERMS and TERMS[name] is not fn:
            raise ValueError(f"picker term {name!r} is already registered")
        TERMS[name] = fn
        return fn

    return add


@register("queue")
def queue_term(c: Candidate, v: View) -> float:
    """Shorter queue is better, relative to the others (as the Inference
    Extension's queue scorer): 1 for the shortest, 0 for the longest."""
    if v.max_queue == v.min_queue:
        return 1.0
    return (v.max_queue - c.queue) / (v.max_queue - v.min_queue)


def _kv_free(c: Candidate) -> float | None:
    if c.load is None or c.load.sample.kv_usage is None:
        return None
    return 1.0 - c.load.sample.kv_usage


@register("kv")
def kv_term(c: Candidate, v: View) -> float:
    """Free KV cache (1 - use). An instance without the signal (not scraped
    yet, or its scrape late) scores the mean of those with it: neither
    preferred nor avoided for what is not known (a fixed 0.5 sent new
    prompts away from a just-started, empty instance to half-empty ones)."""
    free = _kv_free(c)
    return v.kv_known if free is None else free


def _deepest(blocks: tuple[str, ...], held: frozenset[str]) -> int:
    # Block hashes are chained, so holding block k means having cached the
    # whole prefix up to k once; the report is a bounded recent sample, so
    # the deepest block found counts rather than an unbroken run from 0.
    for k in range(len(blocks) - 1, -1, -1):
        if blocks[k] in held:
            return k + 1
    return 0


@register("prefix")
def prefix_term(c: Candidate, v: View) -> float:
    """Fraction of the prompt's leading blocks this picker sent to it."""
    if not v.ask.blocks:
        return 0.0
    return v.approx_hits.get(c.instance, 0) / len(v.ask.blocks)


@register("prefix_precise")
def prefix_precise_term(c: Candidate, v: View) -> float:
    """Fraction of the prompt's blocks up to the deepest one the instance
    reports holding."""
    if not v.ask.blocks or c.load is None:
        return 0.0
    return _deepest(v.ask.blocks, c.load.sample.blocks) / len(v.ask.blocks)


@register("adapter")
def adapter_term(c: Candidate, v: View) -> float:
    """1 when the request's LoRA adapter is loaded there (or none is asked)."""
    if not v.ask.adapter:
        return 1.0
    return 1.0 if c.load is not None and v.ask.adapter in c.load.sample.adapters else 0.0


#: llm-d's default weights (prefix 3, KV 2, queue 2) plus adapter affinity
DEFAULT_WEIGHTS: dict[str, float] = {"prefix": 3.0, "queue": 2.0, "kv": 2.0, "adapter": 1.0}


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Validated weights; ValueError naming the bad term or weight."""
    out: dict[str, float] = {}
    for name, w in weights.items():
        if name not in TERMS:
            raise ValueError(
                f"picker term {name[:40]!r} is unknown (known: {', '.join(sorted(TERMS))})"
            )
        if not isinstance(w, int | float) or w < 0:
            raise ValueError(f"picker weight of {name!r} must be a number >= 0")
        out[name] = float(w)
    if not any(out.values()):
        raise ValueError("picker weights: at least one must be > 0")
    return out


@dataclass
class ScoredPicker:
    """The LLM-aware picker: highest weighted score wins; ties go to the
    shorter queue, then to the instance this picker sent fewer prefix
    blocks (so new prefixes spread over an idle fleet instead of piling on
    its first instance, whose cache would then thrash), then to the first
    candidate."""

    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    clock: Callable[[], float] = lambda: 0.0
    index_blocks: int = 100_000
    index_ttl_s: float = 600.0
    #: block hash -> {instance: last sent}; LRU, at most index_blocks entries
    _index: OrderedDict[str, dict[str, float]] = field(default_factory=OrderedDict)
    #: instance -> blocks of ``_index`` it holds (kept with the index)
    _held: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.weights = check_weights(self.weights)
        self._terms = [(TERMS[n], w) for n, w in self.weights.items() if w > 0]

    def _approx(self, ask: Ask, now: float) -> dict[str, int]:
        hits: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, b in enumerate(ask.blocks):
            holders = self._index.get(b)
            if not holders:
                break
            here = {i for i, t in holders.items() if now - t <= self.index_ttl_s}
            alive = here if alive is None else alive & here
            if not alive:
                break
            for i in alive:
                hits[i] = depth + 1
        return hits

    def pick(self, candidates: Sequence[Candidate], ask: Ask) -> str:
        """The chosen instance (ValueError when there is none)."""
        if not candidates:
            raise ValueError("no instance to pick from")
        now = self.clock()
        queues = [c.queue for c in candidates]
        known = [f for f in map(_kv_free, candidates) if f is not None]
        kv_known = sum(known) / len(known) if known else 0.5
        view = View(ask, candidates, self._approx(ask, now), max(queues), min(queues), kv_known)
        held = self._held
        best = max(
            range(len(candidates)),
            key=lambda k: (
                sum(w * fn(candidates[k], view) for fn, w in self._terms),
                -queues[k],
                -held.get(candidates[k].instance, 0),
                -k,
            ),
        )
        chosen = candidates[best].instance
        self._remember(ask, chosen, now)
        return chosen

    def _remember(self, ask: Ask, instance: str, now: float) -> None:
        held = self._held
        for b in ask.blocks:
            holders = self._index.setdefault(b, {})
            if instance not in holders:
                held[instance] = held.get(instance, 0) + 1
            holders[instance] = now
            self._index.move_to_end(b)
        while len(self._index) > self.index_blocks:
            for i in self._index.popitem(last=False)[1]:
                held[i] -= 1

    def forget(self, instance: str) -> None:
        """The instance is gone: it holds nothing any more."""
        for holders in self._index.values():
            holders.pop(instance, None)
        self._held.pop(instance, None)


@dataclass
class LeastRequest:
    """Baseline: fewest requests in flight (ties: first candidate)."""

    def pick(self, candidates: Sequence[Candidate], ask: Ask) -> str:
        """The candidate with the shortest queue."""
        if not candidates:
            raise ValueError("no instance to pick from")
        return min(candidates, key=lambda c: c.inflight).instance

    def forget(self, instance: str) -> None:
        """Nothing is kept per instance."""


@dataclass
class RoundRobin:
    """Baseline: the next candidate in turn."""

    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self, candidates: Sequence[Candidate], ask: Ask) -> str:
        """The next candidate in turn."""
        if not candidates:
            raise ValueError("no instance to pick from")
        return candidates[next(self._turn) % len(candidates)].instance

    def forget(self, instance: str) -> None:
        """Nothing is kept per instance."""


Picker = ScoredPicker | LeastRequest | RoundRobin
POLICIES = ("llm", "least-request", "round-robin")


def make(
    policy: str, clock: Callable[[], float], weights: Mapping[str, float] | None = None
) -> Picker:
    """A picker by policy name (``POLICIES``); ValueError naming the policy."""
    if policy == "llm":
        return ScoredPicker(dict(weights or DEFAULT_WEIGHTS), clock)
    if policy == "least-request":
        return LeastRequest()
    if policy == "round-robin":
        return RoundRobin()
    raise ValueError(f"picker policy {policy[:40]!r} is unknown (known: {', '.join(POLICIES)})")
