"""Service level objectives over bench results: ``p99_cold_start<50ms``.

Grammar: ``METRIC OP VALUE[UNIT]``, several joined by commas. METRIC is
``pNN_`` or ``mean_`` followed by ``dispatch`` (warm dispatch), ``cold_start``
or ``scheduling``; or a throughput (``requests_per_s``, ``instances_per_s``,
``rpcs_per_s``), its ``ratio_`` to the raw echo, ``ratio_warm_p99`` (the
warm p99 over the raw echo's p99 on the same open-loop schedule), or
``error_rate``. OP is one
of < <= > >=. Latency units: us, ms (default), s. Rates: ``2000/s``. Error
rate: ``1%`` or ``0.01``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_LAT = {"dispatch": "warm_dispatch", "warm_dispatch": "warm_dispatch"}
_LAT.update(cold_start="cold_start", scheduling="scheduling")
_TPUT = ("requests_per_s", "instances_per_s", "rpcs_per_s")
#: ratio_ metrics: the throughputs', and the warm tail's to the same-rate echo
_RATIOS = (*_TPUT, "warm_p99")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_RE = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*([a-z%/]*)\s*$")
_UNITS_MS = {"": 1.0, "ms": 1.0, "s": 1000.0, "us": 0.001}


class SloError(ValueError):
    """A malformed objective; the message shows the grammar."""


@dataclass(frozen=True)
class Objective:
    """One parsed objective."""

    text: str
    metric: str
    op: str
    value: float  # ms for latencies, per second for rates, a fraction for error_rate

    def measure(self, plan: dict[str, Any]) -> float:
        """This objective's metric in a plan result (NaN when not measured)."""
        m = self.metric
        if m.startswith("ratio_"):
            return float(plan.get("ratio_to_echo", {}).get(m[6:], math.nan))
        if m in _TPUT:
            return float(plan.get("throughput", {}).get(m, math.nan))
        if m == "error_rate":
            r = plan.get("requests", {})
            n = r.get("measured", 0)
            return r.get("errors", 0) / n if n else math.nan
        stat, _, lat = m.partition("_")
        s = plan.get("latency_ms", {}).get(_LAT[lat], {})
        if not s or not s.get("count"):
            return math.nan
        v = s.get(stat)
        return math.nan if v is None else float(v)

    def check(self, plan: dict[str, Any]) -> tuple[float, bool | None]:
        """(measured value, met?); met is None when the plan did not measure it."""
        v = self.measure(plan)
        if math.isnan(v):
            return v, None
        return v, _OPS[self.op](v, self.value)


def parse(text: str) -> list[Objective]:
    """Parse one or more comma-separated objectives."""
    out = []
    for part in [p for p in text.split(",") if p.strip()]:
        m = _RE.match(part.lower())
        if not m:
            raise SloError(f"objective {part!r}: expected METRIC<VALUE, e.g. p99_cold_start<50ms")
        metric, op, num, unit = m.groups()
        try:
            value = float(num)
        except ValueError:
            raise SloError(f"objective {part!r}: {num!r} is not a number") from None
        if (metric.startswith("ratio_") and metric[6:] in _RATIOS) or metric == "error_rate":
            if unit == "%":
                value /= 100.0
            elif unit not in ("", "x"):
                raise SloError(f"objective {part!r}: unit must be % or x")
        elif metric in _TPUT:
            if unit not in ("", "/s"):
                raise SloError(f"objective {part!r}: a rate is given as N/s")
        else:
            stat, _, lat = metric.partition("_")
            if lat not in _LAT or not (stat == "mean" or re.fullmatch(r"p(50|90|95|99)", stat)):
                raise SloError(
                    f"objective {part!r}: unknown metric {metric!r} (pNN_ or mean_ + "
                    "dispatch/cold_start/scheduling, requests_per_s, instances_per_s, "
                    "ratio_requests_per_s, ratio_warm_p99, error_rate)"
                )
            if unit not in _UNITS_MS:
                raise SloError(f"objective {part!r}: latency unit must be us, ms or s")
            value *= _UNITS_MS[unit]
        out.append(Objective(part.strip(), metric, op, value))
    if not out:
        raise SloError("no objective given, e.g. p99_cold_start<50ms")
    return out


def parse_rate(text: str) -> float:
    """``2000/s`` or ``2000`` -> 2000.0 requests per second."""
    t = text.strip().lower().removesuffix("/s")
    try:
        v = float(t)
    except ValueError:
        raise SloError(f"load {text!r}: expected a rate like 2000/s") from None
    if v <= 0:
        raise SloError(f"load {text!r}: must be positive")
    return v
