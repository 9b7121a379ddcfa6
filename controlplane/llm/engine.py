"""An emulated LLM engine: continuous batching with a KV-cache budget and a
prefix cache (pure: no I/O, the caller's clock). This is an emulation, named
so everywhere: it produces no text worth reading, only the timing and
resource behaviour of an inference engine, so hundreds of "LLM instances" fit
on one machine for fleet-scale experiments.

The model of one engine iteration (vLLM's scheduler, simplified):

* Requests wait in arrival order. At each iteration boundary the engine
  admits waiting requests while the running batch has room (``max_running``)
  and the KV cache has room for their prompt (``kv_capacity_tokens``); a
  request that does not fit waits (head-of-line: vLLM's FCFS).
* An admitted request's prompt is split in blocks of ``block_tokens``; the
  leading blocks found in the prefix cache (by chained block hash) need no
  prefill. The iteration lasts ``uncached prompt tokens / prefill_tps`` for
  the newly admitted requests plus one decode step, whose time grows with
  the batch: ``tpot_base_s + tpot_per_seq_s * running``.
* At the end of an iteration every running request has one more token (a
  newly admitted one its first: that is its TTFT); a request with
  ``max_tokens`` tokens finishes and frees its KV; its prompt's blocks stay in
  the prefix cache (LRU, ``prefix_cache_blocks``).

``plan(now)`` returns the next iteration (or None when idle) and
``complete(step)`` applies it; the server sleeps for ``step.duration`` in
between, so an idle or waiting engine spends no CPU.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

# The prompt blocks a request carries (shared with the gateway's routing hint).
from controlplane.runtime.llmprompt import block_hashes as block_hashes


class QueueFull(Exception):
    """More requests wait than ``max_waiting``: refuse (the caller answers 429)."""


@dataclass(frozen=True)
class Profile:
    """An emulated model on emulated hardware (see ``profiles``)."""

    name: str
    prefill_tps: float
    tpot_base_s: float
    tpot_per_seq_s: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    block_tokens: int = 16
    max_running: int = 256
    max_waiting: int = 10_000
    prefix_cache_blocks: int = 4096
    #: weights load time (a cold start), seconds
    load_s: float = 0.0
    #: emulated wake from sleep (a new context over loaded weights), seconds
    wake_s: float = 0.0


@dataclass(eq=False)
class Request:
    """One generation request."""

    id: str
    prompt_tokens: int
    max_tokens: int
    #: chained hashes of the prompt's full blocks (``block_hashes``)
    blocks: tuple[str, ...] = ()
    arrived: float = 0.0
    generated: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    #: its KV cache came from a prefill instance (disaggregated serving):
    #: no prefill here, and no prefix-cache lookup
    imported: bool = False
    #: the prefill instance it came from (reported in usage), "" if none
    prefilled_by: str = ""

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens it holds while running."""
        return self.prompt_tokens + self.generated


@dataclass
class Step:
    """One planned iteration."""

    started: float
    duration: float
    admitted: list[Request]
    batch: list[Request]

    @property
    def ends(self) -> float:
        """When the iteration's tokens are out."""
        return self.started + self.duration


@dataclass
class Counters:
    """Totals since start (what /metrics exports)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which were cached
    finished: int = 0
    preempted: int = 0


@dataclass
class Engine:
    """See the module docstring."""

    profile: Profile
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    prefix: OrderedDict[str, None] = field(default_factory=OrderedDict)
    counters: Counters = field(default_factory=Counters)

    @property
    def kv_used_tokens(self) -> int:
        """KV tokens held by the running batch."""
        return sum(r.kv_tokens for r in self.running)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use (vllm:gpu_cache_usage_perc)."""
        return min(1.0, self.kv_used_tokens / self.profile.kv_capacity_tokens)

    def submit(self, req: Request) -> None:
        """Queue a request (QueueFull past ``max_waiting``; ValueError for
        one that could never fit the KV cache)."""
        if req.prompt_tokens + req.max_tokens > self.profile.kv_capacity_tokens:
            raise ValueError(
                f"prompt plus max_tokens ({req.prompt_tokens + req.max_tokens}) exceed the KV "
                f"cache ({self.profile.kv_capacity_tokens} tokens)"
            )
        if len(self.waiting) >= self.profile.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests waiting")
        self.waiting.append(req)

    def _cached_prefix(self, req: Request) -> int:
        hit = 0
        for h in req.blocks:
            if h not in self.prefix:
                break
            self.prefix.move_to_end(h)
            hit += 1
        return min(hit * self.profile.block_tokens, req.prompt_tokens)

    def plan(self, now: float) -> Step | None:
        """Admit what fits and plan the next iteration; None when idle."""
        p = self.profile
        admitted: list[Request] = []
        used = self.kv_used_tokens
        while self.waiting and len(self.running) + len(admitted) < p.max_running:
            head = self.waiting[0]
            # Room for the prompt and the first token; later tokens grow into
            # the cache as they come (a full cache then waits for a finish).
            if used + head.prompt_tokens + 1 > p.kv_capacity_tokens:
                break
            self.waiting.popleft()
            if head.imported:
                head.cached_tokens = head.prompt_tokens
            else:
                head.cached_tokens = self._cached_prefix(head)
                self.counters.prefix_queries += head.prompt_tokens
                self.counters.prefix_hits += head.cached_tokens
            admitted.append(head)
            used += head.prompt_tokens + 1
        batch = [r for r in self.running if r.kv_tokens + 1 <= p.kv_capacity_tokens] + admitted
        if not batch:
            return None
        prefill = sum(r.prompt_tokens - r.cached_tokens for r in admitted) / p.prefill_tps
        decode = p.tpot_base_s + p.tpot_per_seq_s * len(batch)
        self.running.extend(admitted)
        return Step(now, prefill + decode, admitted, batch)

    def complete(self, step: Step) -> list[Request]:
        """Apply an iteration: one token for every request in its batch.
        Returns the requests that got a token (finished ones have
        ``finished_at`` set and left the batch)."""
        t = step.ends
        for r in step.batch:
            r.generated += 1
            self.counters.generation_tokens += 1
            if r.first_token_at is None:
                r.first_token_at = t
                self.counters.prompt_tokens += r.prompt_tokens
                self._remember(r)
            if r.generated >= r.max_tokens:
                r.finished_at = t
                self.counters.finished += 1
        self.running = [r for r in self.running if r.finished_at is None]
        return step.batch

    def cancel(self, req: Request) -> None:
        """A client went away: drop its request wherever it is."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.running = [r for r in self.running if r is not req]

    def _remember(self, req: Request) -> None:
        for h in req.blocks:
            self.prefix[h] = None
            self.prefix.move_to_end(h)
        while len(self.prefix) > self.profile.prefix_cache_blocks:
            self.prefix.popitem(last=False)

    def cached_blocks(self, limit: int = 256) -> list[str]:
        """The most recently used prefix blocks (what a router may ask for)."""
        return list(reversed(self.prefix))[:limit]
