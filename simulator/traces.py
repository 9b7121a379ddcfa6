"""Real traces as workloads (formats: ../shared/data/*/README.md).

- Azure Functions 2019 (Shahrad et al., ATC'20), In-Vitro sample format:
  per-minute counts per function. Each minute's count is spread over the
  minute uniformly at random with a seeded generator (given the count, that
  is exactly a Poisson process within the minute) or evenly (``spread="even"``).
  A request's duration is drawn from its function's duration percentiles
  (linear interpolation between the published 0/1/25/50/75/99/100th
  percentiles, in ms). Memory is AverageAllocatedMb; CPU is proportional to
  memory at 1 vCPU per 1,769 MB (the AWS Lambda ratio In-Vitro also uses).
- Azure Functions 2021 (Zhang et al., SOSP'21): one row per invocation;
  start = end_timestamp - duration.
- Azure LLM inference 2023 (Patel et al., Splitwise, ISCA'24): one function
  per service (code, conv); a request's run time comes from ``LlmCost``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from simulator.engine import Batch
from simulator.workload import FunctionDef, Workload

#: shared/ sits next to the repository (../shared from the repo root).
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data"
AZURE_2019 = DATA / "azure-functions-2019" / "sample-500-8h"
AZURE_2021 = DATA / "azure-functions-2021" / "Azure2021_200.csv"
LLM_2023 = DATA / "azure-llm-inference-2023"
PCTS = (0.0, 0.01, 0.25, 0.50, 0.75, 0.99, 1.0)
PCT_COLS = ("0", "1", "25", "50", "75", "99", "100")
MB_PER_VCPU = 1769.0


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names it."""


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None


#: File names of the three tables: the In-Vitro sample's, then the
#: published dataset's (one file per day: the first day found is read).
_FILES = {
    "invocations": ("invocations.csv", "invocations_per_function_md.anon.d*.csv"),
    "durations": ("durations.csv", "function_durations_percentiles.anon.d*.csv"),
    "memory": ("memory.csv", "app_memory_percentiles.anon.d*.csv"),
}


def _find(folder: Path, table: str) -> Path:
    for pattern in _FILES[table]:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    raise TraceError(f"{folder}: no {table} file (looked for {', '.join(_FILES[table])})")


def _key_columns(path: Path, row: dict[str, str]) -> list[str]:
    """HashOwner, HashApp and, when the file has it, HashFunction."""
    for col in ("HashOwner", "HashApp"):
        if col not in row:
            raise TraceError(f"{path}: column {col!r} is missing")
    return ["HashOwner", "HashApp"] + (["HashFunction"] if "HashFunction" in row else [])


def _minute_columns(path: Path, row: dict[str, str]) -> list[str]:
    """The per-minute count columns, named ``1..1440`` or ``minute_1..``."""
    cols = [c for c in row if c.isdigit()]
    if not cols:
        cols = [c for c in row if c.startswith("minute_") and c[7:].isdigit()]
    if not cols:
        raise TraceError(
            f"{path}: no minute columns (expected columns named 1..1440 or minute_1..minute_1440)"
        )
    return cols


def _count(path: Path, row: dict[str, str], col: str) -> int:
    try:
        return int(row[col] or 0)
    except ValueError:
        raise TraceError(f"{path}: column {col!r} holds {row[col][:20]!r}, not a count") from None


def _index(path: Path, keys: list[str], needed: list[str]) -> dict[tuple[str, ...], dict[str, str]]:
    """Rows by function key (or by app, for per-app files)."""
    rows = _rows(path)
    if not rows:
        raise TraceError(f"{path} has no rows")
    for col in needed:
        if col not in rows[0]:
            raise TraceError(f"{path}: column {col!r} is missing")
    have = [k for k in keys if k in rows[0]]
    if have[:2] != ["HashOwner", "HashApp"]:
        raise TraceError(f"{path}: columns 'HashOwner' and 'HashApp' are required")
    return {tuple(r[k] for k in have): r for r in rows}


def azure2019(
    folder: Path = AZURE_2019,
    *,
    seed: int = 1,
    minutes: int | None = None,
    spread: str = "uniform",
    concurrency: int = 1,
    cold_start_s: float | None = None,
) -> Workload:
    """The In-Vitro sample of the Azure Functions 2019 trace (first
    ``minutes`` minutes, default all)."""
    if spread not in ("uniform", "even"):
        raise TraceError(f"spread must be 'uniform' or 'even', got {spread!r}")
    inv_path = _find(folder, "invocations")
    inv = _rows(inv_path)
    if not inv:
        raise TraceError(f"{inv_path} has no rows")
    keys = _key_columns(inv_path, inv[0])
    minute_cols = _minute_columns(inv_path, inv[0])
    dur_path, mem_path = _find(folder, "durations"), _find(folder, "memory")
    durs = _index(dur_path, keys, [f"percentile_Average_{p}" for p in PCT_COLS])
    mem = _index(mem_path, keys, ["AverageAllocatedMb"])
    cols = minute_cols[:minutes] if minutes else minute_cols
    counts = np.array([[_count(inv_path, r, c) for c in cols] for r in inv], dtype=np.int64)
    if int(counts.sum()) == 0:
        raise TraceError(
            f"{inv_path}: no invocations in the {len(cols)} minutes read (columns "
            f"{cols[0]}..{cols[-1]}): a table of zeros is not a workload"
        )
    pct = np.empty((len(inv), len(PCTS)))
    fdefs = []
    for i, r in enumerate(inv):
        key = tuple(r[k] for k in keys)
        d = durs.get(key)
        m = mem.get(key) or mem.get(key[:2])  # per-app memory files
        if d is None or m is None:
            which = dur_path if d is None else mem_path
            raise TraceError(f"{which}: no row for function {'/'.join(k[:12] for k in key)}")
        pct[i] = [float(d[f"percentile_Average_{p}"]) / 1000.0 for p in PCT_COLS]
        mb = max(1, math.ceil(float(m["AverageAllocatedMb"])))
        fd = FunctionDef(
            f"az-{i}",
            cpu_millis=max(10, round(mb * 1000 / MB_PER_VCPU)),
            memory_mib=mb,
            concurrency=concurrency,
        )
        fdefs.append(fd if cold_start_s is None else replace(fd, cold_start_s=cold_start_s))

    def make() -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for m in range(counts.shape[1]):
            c = counts[:, m]
            active = np.nonzero(c)[0]
            f = np.repeat(active, c[active])
            if spread == "uniform":
                t = m * 60.0 + rng.random(len(f)) * 60.0
            else:
                t = np.concatenate([m * 60.0 + (np.arange(k) + 0.5) * 60.0 / k for k in c[active]])
            u = rng.random(len(f))
            d = np.empty(len(f))
            start = 0
            for fi, k in zip(active, c[active], strict=True):
                d[start : start + k] = np.interp(u[start : start + k], PCTS, pct[fi])
                start += k
            order = np.argsort(t, kind="stable")
            yield t[order].tolist(), f[order].tolist(), d[order].tolist()

    total = int(counts.sum())
    return Workload(
        f"azure2019-{len(inv)}fn-{len(cols)}min",
        fdefs,
        len(cols) * 60.0,
        make,
        total,
        notes=[
            f"Azure Functions 2019 sample ({folder.name}): {len(inv)} functions, {len(cols)} "
            f"minutes, {total} invocations; per-minute counts spread {spread}ly within each "
            "minute (seeded); durations from each function's percentiles",
        ],
    )


def azure2021(path: Path = AZURE_2021, *, concurrency: int = 1) -> Workload:
    """The per-invocation Azure Functions 2021 sample."""
    rows = _rows(path)
    if not rows:
        raise TraceError(f"{path} has no rows")
    ids: dict[tuple[str, str], int] = {}
    t, f, d = [], [], []
    for r in rows:
        dur = float(r["duration"])
        t.append(float(r["end_timestamp"]) - dur)
        f.append(ids.setdefault((r["app"], r["func"]), len(ids)))
        d.append(dur)
    order = sorted(range(len(t)), key=t.__getitem__)
    ts, fs, ds = [t[i] for i in order], [f[i] for i in order], [d[i] for i in order]
    fdefs = [FunctionDef(f"az21-{i}", concurrency=concurrency) for i in range(len(ids))]
    return Workload(
        "azure2021",
        fdefs,
        max(a + b for a, b in zip(ts, ds, strict=True)),
        lambda: iter([(ts, fs, ds)]),
        len(ts),
        notes=[f"Azure Functions 2021 sample: {len(ts)} invocations of {len(ids)} functions"],
    )


@dataclass(frozen=True)
class LlmCost:
    """Run time of one LLM request: prefill then decode.

    time = ttft_base_s + context_tokens / prefill_tps + generated_tokens * tpot_s

    Prefill is compute-bound and about linear in prompt length, decode is
    memory-bound at a roughly constant time per output token (Patel et al.,
    Splitwise, ISCA'24, section 3). Defaults are order-of-magnitude figures
    for a 13B-parameter model on one A100 (prefill ~8k tokens/s, ~30 ms per
    output token); they are parameters, not measurements.
    """

    ttft_base_s: float = 0.02
    prefill_tps: float = 8000.0
    tpot_s: float = 0.03

    def seconds(self, context: float, generated: float) -> float:
        """Service time of one request."""
        return self.ttft_base_s + context / self.prefill_tps + generated * self.tpot_s


def _llm_rows(path: Path) -> tuple[list[float], list[float]]:
    """Arrival times (s) and flattened (context, generated) token counts."""
    ts, tokens = [], []
    for r in _rows(path):
        stamp, _, frac = r["TIMESTAMP"].partition(".")
        base = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        ts.append(base + float(f"0.{frac or '0'}"))
        tokens.append(float(r["ContextTokens"]))
        tokens.append(float(r["GeneratedTokens"]))
    return ts, tokens


def llm2023(
    folder: Path = LLM_2023,
    *,
    cost: LlmCost | None = None,
    concurrency: int = 8,
    gpus: int = 1,
    cold_start_s: float = 5.0,
) -> Workload:
    """The Azure LLM inference traces: functions llm-code and llm-conv.

    concurrency: requests batched per instance; cold_start_s: model load time
    (26 GB of 13B weights at ~5 GB/s). Both are parameters.
    """
    cm = cost or LlmCost()
    events: list[tuple[float, int, float]] = []
    for fi, name in enumerate(("code", "conv")):
        ts, tok = _llm_rows(folder / f"AzureLLMInferenceTrace_{name}.csv")
        for k, t in enumerate(ts):
            events.append((t, fi, cm.seconds(tok[2 * k], tok[2 * k + 1])))
    if not events:
        raise TraceError(f"{folder}: no requests")
    events.sort()
    t0 = events[0][0]
    ts2 = [e[0] - t0 for e in events]
    fs2 = [e[1] for e in events]
    ds2 = [e[2] for e in events]
    fdefs = [
        FunctionDef(
            f"llm-{n}",
            cpu_millis=4000,
            memory_mib=32768,
            gpus=gpus,
            concurrency=concurrency,
            cold_start_s=cold_start_s,
        )
        for n in ("code", "conv")
    ]
    return Workload(
        "llm2023",
        fdefs,
        ts2[-1] + max(ds2),
        lambda: iter([(ts2, fs2, ds2)]),
        len(ts2),
        notes=[
            f"Azure LLM inference 2023: {len(ts2)} requests (code + conv); run time = "
            f"{cm.ttft_base_s:g} s + context/{cm.prefill_tps:g} tok/s + generated x "
            f"{cm.tpot_s:g} s; {concurrency} requests per instance; model load {cold_start_s:g} s",
        ],
    )
