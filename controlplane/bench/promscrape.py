"""Scrape Prometheus /metrics endpoints and read histograms from them.

Scheduling latency is only visible inside Schedule (``ScheduleReply`` goes
to Dispatch), so the bench reads ``galaxy_scheduling_latency_seconds`` from
every Schedule process before and after the measured phase and summarizes
the difference. Quantiles come from bucket counts (linear inside a bucket),
so they are as fine as the buckets (scheduling latency: 25 us to 1 s, 1 ms apart
between 1 and 5 ms; cold starts: 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25 ms...).
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Histogram:
    """Cumulative bucket counts (upper bound -> count), with sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def __add__(self, other: Histogram) -> Histogram:
        keys = set(self.buckets) | set(other.buckets)
        return Histogram(
            {k: self.buckets.get(k, 0.0) + other.buckets.get(k, 0.0) for k in keys},
            self.sum + other.sum,
            self.count + other.count,
        )

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram(
            {k: v - other.buckets.get(k, 0.0) for k, v in self.buckets.items()},
            self.sum - other.sum,
            self.count - other.count,
        )

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) by linear interpolation in its bucket; NaN if empty."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        prev_bound, prev_count = 0.0, 0.0
        for bound in sorted(self.buckets):
            c = self.buckets[bound]
            if c >= rank:
                if math.isinf(bound):
                    return prev_bound  # beyond the last finite bucket: a lower bound
                width = c - prev_count
                frac = 0.0 if width <= 0 else (rank - prev_count) / width
                return prev_bound + (bound - prev_bound) * frac
            prev_bound, prev_count = bound, c
        return prev_bound

    def summary_ms(self) -> dict[str, float]:
        """count, mean, p50..p99 in milliseconds (stddev is not knowable)."""
        n = self.count
        return {
            "count": n,
            "mean": self.sum / n * 1000.0 if n else math.nan,
            "stddev": math.nan,
            "p50": self.quantile(0.50) * 1000.0,
            "p90": self.quantile(0.90) * 1000.0,
            "p95": self.quantile(0.95) * 1000.0,
            "p99": self.quantile(0.99) * 1000.0,
            "max": math.nan,
        }


@dataclass
class Scrape:
    """What one scrape of one endpoint found."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


def _labelled(name: str, labels: dict[str, str]) -> str:
    """``name{k=v,...}`` (sorted; ``le`` left out), or name without labels."""
    inner = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "le")
    return f"{name}{{{inner}}}" if inner else name


def parse(text: str) -> Scrape:
    """Histograms (by name, labels summed; and by ``name{labels}`` for a
    labelled one, e.g. ``galaxy_gc_pause_seconds{generation=2}``) and
    counters (by name+labels)."""
    out = Scrape()
    for fam in text_string_to_metric_families(text):
        if fam.type == "histogram":
            total = out.histograms.setdefault(fam.name, Histogram())
            for s in fam.samples:
                key = _labelled(fam.name, s.labels)
                hs = (
                    [total]
                    if key == fam.name
                    else [total, out.histograms.setdefault(key, Histogram())]
                )
                for h in hs:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        h.buckets[le] = h.buckets.get(le, 0.0) + s.value
                    elif s.name.endswith("_sum"):
                        h.sum += s.value
                    elif s.name.endswith("_count"):
                        h.count += s.value
        elif fam.type == "counter":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    key = _labelled(s.name, s.labels)
                    out.counters[key] = out.counters.get(key, 0.0) + s.value
    return out


def _fetch(address: str, timeout_s: float) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
        return str(r.read().decode())


async def scrape(address: str, timeout_s: float = 5.0) -> Scrape:
    """Scrape one endpoint (the HTTP GET runs in a thread: it blocks)."""
    return parse(await asyncio.to_thread(_fetch, address, timeout_s))


async def scrape_all(addresses: list[str]) -> list[Scrape]:
    """Scrape several endpoints concurrently."""
    return list(await asyncio.gather(*(scrape(a) for a in addresses)))


def histogram_delta(before: list[Scrape], after: list[Scrape], name: str) -> Histogram:
    """Sum over endpoints of (after - before) for histogram ``name``."""
    total = Histogram()
    for b, a in zip(before, after, strict=True):
        ha = a.histograms.get(name)
        if ha is None:
            continue
        total = total + (ha - b.histograms.get(name, Histogram()))
    return total


def counter_delta(before: list[Scrape], after: list[Scrape], prefix: str) -> float:
    """Sum over endpoints of (after - before) of every counter starting with prefix."""
    total = 0.0
    for b, a in zip(before, after, strict=True):
        for k, v in a.counters.items():
            if k.startswith(prefix):
                total += v - b.counters.get(k, 0.0)
    return total
