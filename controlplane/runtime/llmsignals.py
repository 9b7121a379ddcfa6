"""Per-instance LLM load signals, read the way the Gateway API Inference
Extension's endpoint picker reads them: by scraping each instance's
Prometheus ``/metrics`` with vLLM's metric names, so the same path works for
the emulated server, vLLM and llama.cpp's server.

What is read (vLLM names; a missing one counts as absent, not zero, except
the two queue gauges):

=================================  ==========================================
``vllm:num_requests_waiting``      queue depth
``vllm:num_requests_running``      running batch
``vllm:kv_cache_usage_perc``       KV-cache use, 0-1 (vLLM 0.10 on; before,
                                   ``vllm:gpu_cache_usage_perc``, also read)
``vllm:generation_tokens_total``   tokens/s, from two scrapes
``vllm:prefix_cache_queries_total`` prompt tokens looked up in the prefix
``vllm:prefix_cache_hits_total``   cache, and those found (counters)
``vllm:lora_requests_info``        adapters loaded (its ``running_lora_adapters``
                                   and ``waiting_lora_adapters`` labels)
``galaxy:prefix_cache_block``      digests of the most recent prefix blocks
                                   (``block`` label; at most ``max_blocks`` read)
``vllm:time_to_first_token_seconds``  TTFT histogram (cumulative buckets)
``vllm:request_time_per_output_token_seconds``, else
``vllm:time_per_output_token_seconds``, else
``vllm:inter_token_latency_seconds``  TPOT histogram (the first present: vLLM
                                   renamed its per-token one and added a
                                   per-request one)
=================================  ==========================================

Histograms are kept as their cumulative buckets; ``llmlatency`` turns the
difference between two scrapes into a recent percentile.

Bounded: a page over ``max_bytes`` is refused, at most ``max_blocks`` block
digests and ``max_adapters`` adapters are kept, and every scrape has a
deadline. ``LoadBook`` (pure, caller's clock) keeps the last sample of each
instance and derives tokens/s; ``scrape`` is the only I/O here.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    # Imported where a scrape runs: Dispatch loads this module for every
    # function, and aiohttp's import (~90 ms of CPU, its TLS context
    # included) is paid only by a Dispatch that routes an LLM.
    import aiohttp

#: a /metrics page larger than this is refused (vLLM's is ~30 kB)
MAX_BYTES = 1 << 20
#: histogram buckets kept per metric (vLLM's have 13-22)
MAX_BUCKETS = 64
TTFT = "vllm:time_to_first_token_seconds"
#: TPOT histograms by preference (the per-request one is vLLM's TPOT definition)
TPOTS = (
    "vllm:request_time_per_output_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
)
#: cumulative histogram buckets: (upper bound ``le``, count), ascending,
#: the last one +Inf
Buckets = tuple[tuple[float, float], ...]


class SignalError(ValueError):
    """A /metrics page that cannot be read as load signals (names why)."""


@dataclass(frozen=True)
class Sample:
    """One scrape of one instance."""

    waiting: int = 0
    running: int = 0
    #: KV-cache use 0-1; None when the server does not report it
    kv_usage: float | None = None
    #: generated tokens since start (a counter); None when not reported
    generation_tokens: float | None = None
    #: prefix-block digests the instance reports (precise prefix affinity)
    blocks: frozenset[str] = frozenset()
    adapters: frozenset[str] = frozenset()
    #: TTFT and TPOT histograms since start (None when not reported)
    ttft: Buckets | None = None
    tpot: Buckets | None = None
    #: prompt tokens looked up in the prefix cache since start, and those it
    #: held (counters); None when not reported
    prefix_queries: float | None = None
    prefix_hits: float | None = None


@dataclass(frozen=True)
class Load:
    """What a router or autoscaler knows of one instance."""

    instance: str
    at: float
    sample: Sample = field(default_factory=Sample)
    #: generated tokens per second between the last two scrapes (0 on the first)
    tokens_per_s: float = 0.0

    @property
    def queue(self) -> int:
        """Requests waiting plus running (what least-request counts)."""
        return self.sample.waiting + self.sample.running

    @property
    def kv_usage(self) -> float:
        """KV-cache use, 0-1 (0 when the instance does not report it)."""
        return self.sample.kv_usage or 0.0


def parse(text: str, max_blocks: int = 256, max_adapters: int = 32) -> Sample:
    """A Sample from a Prometheus text page (vLLM's names; see the module
    docstring). Values of several label sets (models) are summed."""
    if len(text) > MAX_BYTES:
        raise SignalError(f"/metrics: {len(text)} bytes, over the {MAX_BYTES} limit")
    values: dict[str, float] = {}
    blocks: set[str] = set()
    adapters: set[str] = set()
    hists: dict[str, dict[float, float]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith("_bucket") and s.name[:-7] in _HISTOGRAMS:
                    _bucket(hists.setdefault(s.name[:-7], {}), s.labels.get("le", ""), s.value)
                elif s.name == "galaxy:prefix_cache_block":
                    if len(blocks) < max_blocks and "block" in s.labels:
                        blocks.add(s.labels["block"][:64])
                elif s.name == "vllm:lora_requests_info":
                    for key in ("running_lora_adapters", "waiting_lora_adapters"):
                        for a in s.labels.get(key, "").split(","):
                            if a and len(adapters) < max_adapters:
                                adapters.add(a[:64])
                else:
                    values[s.name] = values.get(s.name, 0.0) + s.value
    except ValueError as e:  # the parser's error for a malformed line
        raise SignalError(f"/metrics: not Prometheus text ({str(e)[:80]})") from None
    # vLLM renamed the gauge (it is not only GPUs' any more); the emulated
    # server and older vLLM export the first name.
    kv = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc"))
    tpot = next((hists[n] for n in TPOTS if n in hists), None)
    return Sample(
        waiting=int(values.get("vllm:num_requests_waiting", 0)),
        running=int(values.get("vllm:num_requests_running", 0)),
        kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
        generation_tokens=values.get("vllm:generation_tokens_total"),
        blocks=frozenset(blocks),
        adapters=frozenset(adapters),
        ttft=_cumulative(hists.get(TTFT)),
        tpot=_cumulative(tpot),
        prefix_queries=values.get("vllm:prefix_cache_queries_total"),
        prefix_hits=values.get("vllm:prefix_cache_hits_total"),
    )


_HISTOGRAMS = frozenset((TTFT, *TPOTS))


def _bucket(into: dict[float, float], le: str, value: float) -> None:
    """Add one ``_bucket`` sample (label sets of several models sum)."""
    try:
        bound = float(le)
    except ValueError:
        raise SignalError(f"/metrics: a bucket's le {le[:20]!r} is not a number") from None
    if bound in into or len(into) < MAX_BUCKETS:
        into[bound] = into.get(bound, 0.0) + value


def _cumulative(h: dict[float, float] | None) -> Buckets | None:
    """Ascending buckets ending in +Inf; None without one (not a histogram)."""
    if not h or math.inf not in h:
        return None
    return tuple(sorted(h.items()))


def digest(recent: Iterable[str], limit: int, cache_blocks: int) -> list[str]:
    """The prefix blocks an instance reports: of its cached blocks, most
    recent first, those whose CRC32 falls in a 1-in-``stride`` sample, at
    most ``limit``, where the stride spreads ``limit`` over the whole cache
    (``cache_blocks``). A router that checks every block of a prompt then
    finds the deepest sampled one (block hashes are chained), so a bounded
    report still covers the cache instead of only its newest blocks."""
    stride = max(1, cache_blocks // max(1, limit))
    out: list[str] = []
    for h in recent:
        if zlib.crc32(h.encode()) % stride == 0:
            out.append(h)
            if len(out) >= limit:
                break
    return out


class LoadBook:
    """The last Load of each instance (pure: the caller passes ``now``).
    ``max_age_s`` bounds how old a sample may be and still count."""

    def __init__(self, max_age_s: float = 2.0) -> None:
        self.max_age_s = max_age_s
        self._loads: dict[str, Load] = {}

    def observe(self, instance: str, sample: Sample, now: float) -> Load:
        """Record a scrape; derives tokens/s from the previous one."""
        prev = self._loads.get(instance)
        rate = 0.0
        if (
            prev is not None
            and now > prev.at
            and sample.generation_tokens is not None
            and prev.sample.generation_tokens is not None
            and sample.generation_tokens >= prev.sample.generation_tokens  # no restart
        ):
            rate = (sample.generation_tokens - prev.sample.generation_tokens) / (now - prev.at)
        load = Load(instance, now, sample, rate)
        self._loads[instance] = load
        return load

    def forget(self, instance: str) -> None:
        """The instance is gone."""
        self._loads.pop(instance, None)

    def get(self, instance: str, now: float) -> Load | None:
        """The instance's Load if fresh enough, else None."""
        load = self._loads.get(instance)
        if load is None or now - load.at > self.max_age_s:
            return None
        return load

    def known(self) -> set[str]:
        """Every instance with a sample, fresh or not."""
        return set(self._loads)

    def fresh(self, now: float) -> dict[str, Load]:
        """Every fresh Load by instance."""
        return {i: v for i, v in self._loads.items() if now - v.at <= self.max_age_s}


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    timeout_s: float = 0.5,
    max_blocks: int = 256,
    headers: dict[str, str] | None = None,
) -> Sample:
    """GET ``url`` (an instance's /metrics) within ``timeout_s`` and parse it.
    SignalError on a refused, slow, oversized or malformed answer."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, headers=headers) as resp:
                if resp.status != 200:
                    raise SignalError(f"/metrics: HTTP {resp.status}")
                raw = await resp.content.read(MAX_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise SignalError(f"/metrics: {type(e).__name__}") from None
    return parse(raw.decode("utf-8", "replace"), max_blocks)
