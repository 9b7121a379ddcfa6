"""LLM serving metrics from per-request token timestamps (pure: no I/O).

Definitions (the ones vLLM's ``benchmark_serving`` uses, so figures compare):

- **TTFT**: from the request's send to its first content token.
- **TPOT** (time per output token, the first token excluded): for a request
  with n > 1 output tokens, ``(E2E - TTFT) / (n - 1)``; requests with one
  token have none. n is the server's ``usage.completion_tokens`` when it
  reports it, else the number of content chunks.
- **ITL** (inter-token latency): every gap between consecutive content
  chunks of a stream, pooled over all requests (one sample per gap, so long
  answers weigh more than in TPOT, which is one sample per request).
- **E2E**: from send to the last byte of the answer.
- **Goodput**: requests per second that finished and met every limit given
  (TTFT and/or TPOT), over the measured wall time.
- **Input / output tokens/s**: tokens of the finished requests (usage) over
  the measured wall time.

Each latency is summarised as count, mean, stddev (population), p50, p90,
p95, p99 (numpy's linear interpolation).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATS = ("count", "mean", "stddev", "p50", "p90", "p95", "p99")
LATENCIES = ("ttft", "tpot", "itl", "e2e")
TITLES = {
    "ttft": "TTFT: time to first token",
    "tpot": "TPOT: time per output token, first excluded",
    "itl": "ITL: gap between consecutive tokens (all gaps pooled)",
    "e2e": "E2E: request latency",
}


@dataclass
class Record:
    """One request as the load generator saw it. Times are seconds on one
    monotonic clock; ``chunks`` holds the arrival time of every content
    chunk (a token, for the servers Galaxy runs)."""

    sent: float
    prompt_tokens: int = 0
    output_tokens: int = 0  # from usage; 0 when the server reported none
    chunks: list[float] = field(default_factory=list)
    done: float = math.nan
    error: str = ""

    @property
    def ok(self) -> bool:
        """Finished with at least one token and no error."""
        return not self.error and bool(self.chunks) and not math.isnan(self.done)

    @property
    def n_out(self) -> int:
        """Output tokens: the server's count, else the chunks seen."""
        return self.output_tokens or len(self.chunks)

    def ttft(self) -> float:
        """Seconds from send to the first token."""
        return self.chunks[0] - self.sent

    def e2e(self) -> float:
        """Seconds from send to the end of the answer."""
        return self.done - self.sent

    def tpot(self) -> float | None:
        """(E2E - TTFT) / (n - 1); None for a one-token answer."""
        n = self.n_out
        return (self.done - self.chunks[0]) / (n - 1) if n > 1 else None

    def itls(self) -> list[float]:
        """The gaps between consecutive chunks."""
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


def stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """count, mean, stddev, p50/p90/p95/p99 of values (seconds), in ms by default."""
    if not values:
        return {"count": 0, **{k: math.nan for k in STATS[1:]}}
    a = np.asarray(values, dtype=float) * scale
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {
        "count": len(values),
        "mean": float(a.mean()),
        "stddev": float(a.std()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


@dataclass(frozen=True)
class Limits:
    """Per-request limits for goodput (seconds; None: no limit)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: Record) -> bool:
        """Did a finished request meet every limit?"""
        if not r.ok:
            return False
        if self.ttft_s is not None and r.ttft() > self.ttft_s:
            return False
        tp = r.tpot()
        return self.tpot_s is None or tp is None or tp <= self.tpot_s


def summarize(records: list[Record], wall_s: float, limits: Limits) -> dict[str, Any]:
    """Every metric of one plan: latencies (ms), throughputs, goodput."""
    ok = [r for r in records if r.ok]
    tpots = [t for r in ok if (t := r.tpot()) is not None]
    lat = {
        "ttft": stats([r.ttft() for r in ok]),
        "tpot": stats(tpots),
        "itl": stats([g for r in ok for g in r.itls()]),
        "e2e": stats([r.e2e() for r in ok]),
    }
    good = sum(1 for r in ok if limits.met(r))
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "latency_ms": lat,
        "requests": {"sent": len(records), "ok": len(ok), "errors": len(records) - len(ok)},
        "errors_by_kind": errors,
        "wall_s": wall_s,
        "throughput": {
            "requests_per_s": _div(len(ok), wall_s),
            "goodput_per_s": _div(good, wall_s),
            "goodput_share": _div(good, len(records)),
            "input_tokens_per_s": _div(sum(r.prompt_tokens for r in ok), wall_s),
            "output_tokens_per_s": _div(sum(r.n_out for r in ok), wall_s),
        },
        "limits": {"ttft_s": limits.ttft_s, "tpot_s": limits.tpot_s},
    }


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


# Objectives: "p99_ttft<1s", "mean_tpot<=100ms", "goodput_share>=0.9".
_OBJ = re.compile(
    r"^\s*(p50|p90|p95|p99|mean)_(ttft|tpot|itl|e2e)\s*(<=|<)\s*([0-9.]+)\s*(ms|s)?\s*$"
)
_SHARE = re.compile(r"^\s*goodput_share\s*>=\s*([0-9.]+)\s*$")


class ObjectiveError(ValueError):
    """A malformed LLM objective; the message shows the grammar."""


@dataclass(frozen=True)
class Objective:
    """``STAT_METRIC < VALUE`` on a summary, or ``goodput_share >= X``."""

    text: str
    stat: str
    metric: str
    limit: float  # ms for latencies, a fraction for goodput_share

    def measure(self, summary: dict[str, Any]) -> float:
        """The value this objective looks at (NaN when not measured)."""
        if self.metric == "goodput_share":
            return float(summary["throughput"]["goodput_share"])
        return float(summary["latency_ms"][self.metric][self.stat])

    def met(self, summary: dict[str, Any]) -> bool:
        """Is the objective met? (False when not measured.)"""
        v = self.measure(summary)
        if math.isnan(v):
            return False
        return v >= self.limit if self.metric == "goodput_share" else v <= self.limit


def parse_objectives(text: str) -> list[Objective]:
    """Comma-separated objectives, e.g. ``p99_ttft<1s,p99_tpot<100ms``."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if m := _SHARE.match(part):
            out.append(Objective(part, "", "goodput_share", float(m.group(1))))
            continue
        m = _OBJ.match(part.lower())
        if not m:
            raise ObjectiveError(
                f"objective {part[:40]!r}: expected e.g. p99_ttft<1s, p90_tpot<100ms "
                "(p50|p90|p95|p99|mean of ttft|tpot|itl|e2e) or goodput_share>=0.9"
            )
        stat, metric, _, num, unit = m.groups()
        scale = 1000.0 if unit == "s" else 1.0
        out.append(Objective(part, stat, metric, float(num) * scale))
    if not out:
        raise ObjectiveError("objectives: none given")
    return out
