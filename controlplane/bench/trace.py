"""Replay of the Azure Functions 2019 trace (In-Vitro loader format).

``invocations.csv`` has one row per function and one column per minute with
that minute's invocation count; ``durations.csv`` has each function's average
execution time (ms). A replay takes a window of minutes, keeps the busiest
functions, spreads each minute's invocations uniformly at random within the
minute, and compresses time so the mean rate matches the scenario's
``arrival_rate`` (the sample runs ~hours; a bench runs seconds). Execution
times are compressed by the same factor and become how long a request holds
its instance, so cold starts arise from real concurrency, not from a knob.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SAMPLE = "azure-functions-2019/sample-500-8h"
# Non-minute columns before the per-minute counts in invocations.csv.
_ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")


class TraceError(ValueError):
    """The trace files are missing or malformed; the message says which."""


@dataclass(frozen=True)
class TraceConfig:
    """What part of the trace to replay, and how fast."""

    sample: str = DEFAULT_SAMPLE
    start_minute: int = 0  # offset into the sample's minute columns
    minutes: int = 10
    functions: int = 50  # busiest functions in the window
    max_hold_ms: float = 1000.0  # cap on a (compressed) execution time

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceConfig:
        """From the scenario's ``request_profile`` (distribution: trace)."""
        known = {"sample", "start_minute", "minutes", "functions", "max_hold_ms"}
        bad = sorted(set(d) - known - {"distribution", "arrival_rate"})
        if bad:
            raise TraceError(f"request_profile.{bad[0]}: unknown trace option")
        return cls(
            sample=str(d.get("sample", DEFAULT_SAMPLE)),
            start_minute=int(d.get("start_minute", 0)),
            minutes=int(d.get("minutes", 10)),
            functions=int(d.get("functions", 50)),
            max_hold_ms=float(d.get("max_hold_ms", 1000.0)),
        )


@dataclass(frozen=True)
class Replay:
    """A compressed replay: (time s, function index, hold ms) per request."""

    requests: list[tuple[float, int, float]]
    function_ids: list[str]  # trace HashFunction of each index
    compression: float  # trace seconds per replayed second


def shared_data_dir(repo: Path) -> Path:
    """``<repo>/../shared/data`` (where the project keeps its data sets)."""
    return repo.resolve().parent / "shared" / "data"


def _read_counts(path: Path, cfg: TraceConfig) -> list[tuple[str, list[int]]]:
    try:
        f = path.open(newline="")
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    with f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or tuple(header[: len(_ID_COLUMNS)]) != _ID_COLUMNS:
            raise TraceError(f"{path}: expected columns {', '.join(_ID_COLUMNS)}, then minutes")
        first = len(_ID_COLUMNS) + cfg.start_minute
        last = first + cfg.minutes
        if cfg.minutes < 1 or last > len(header):
            raise TraceError(
                f"{path}: window of {cfg.minutes} minutes from offset {cfg.start_minute} "
                f"exceeds the {len(header) - len(_ID_COLUMNS)} minutes in the sample"
            )
        out = []
        for row in rows:
            counts = [int(x) for x in row[first:last]]
            if any(counts):
                out.append((row[2], counts))
    return out


def _read_durations(path: Path) -> dict[str, float]:
    try:
        with path.open(newline="") as f:
            return {r["HashFunction"]: float(r["Average"]) for r in csv.DictReader(f)}
    except OSError:
        return {}  # durations are optional: requests then release at once


def load(data_dir: Path, cfg: TraceConfig, total: int, arrival_rate: float, seed: int) -> Replay:
    """The first ``total`` requests of the window, compressed to ``arrival_rate``/s."""
    base = data_dir / cfg.sample
    rows = _read_counts(base / "invocations.csv", cfg)
    if not rows:
        raise TraceError(f"{base}: no invocations in the chosen window")
    rows.sort(key=lambda r: sum(r[1]), reverse=True)
    rows = rows[: max(1, cfg.functions)]
    durations = _read_durations(base / "durations.csv")
    n_total = sum(sum(c) for _, c in rows)
    window_s = 60.0 * cfg.minutes
    native_rate = n_total / window_s
    # Only ever speed up: a slower-than-real replay would not be a replay.
    compression = max(1.0, arrival_rate / native_rate)
    rng = random.Random(seed)
    events: list[tuple[float, int, float]] = []
    for idx, (fid, counts) in enumerate(rows):
        hold = min(cfg.max_hold_ms, durations.get(fid, 0.0) / compression)
        for minute, c in enumerate(counts):
            for _ in range(c):
                t = (minute + rng.random()) * 60.0 / compression
                events.append((t, idx, hold))
    events.sort()
    events = events[:total]
    if len(events) < total:
        raise TraceError(
            f"the window holds {len(events)} invocations of the {len(rows)} busiest functions, "
            f"fewer than total_requests={total}; widen 'minutes' or 'functions'"
        )
    return Replay(events, [fid for fid, _ in rows], compression)
