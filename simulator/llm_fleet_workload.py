"""The LLM fleet simulation's inputs: the large-model profile, the node and
model-cache assumptions, and the multi-function workload built from the
Azure LLM inference 2023 trace (``simulator.llm_fleet`` replays it).

Workload construction (stated, so a figure can be reproduced): the code and
conversation traces are merged in time order; each request is given to one
of ``functions`` functions drawn from a Zipf(``zipf_s``) popularity with a
seeded generator (a few popular models, a long tail that idles and scales
to zero, as serverless function popularity is skewed); arrival times are
divided by ``speed`` so the whole fleet of 210 nodes is needed. Each
function serves its own model (its weights are what a node may cache).
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import functools
import itertools
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from controlplane.llm.profiles import profile
from simulator.traces import LLM_2023

TRACES = (
    LLM_2023 / "AzureLLMInferenceTrace_code.csv",
    LLM_2023 / "AzureLLMInferenceTrace_conv.csv",
)

#: A LLaMA-2-70B-class model served with tensor parallelism over 4 GPUs of
#: an 8-GPU node (two instances per node). KV bytes per token from its
#: configuration (80 layers x 8 KV heads (GQA) x 128 x 2 x 2 bytes = 327,680);
#: KV capacity: 4 x 80 GB less 140 GB of fp16 weights, ~170 GB; prefill,
#: decode and engine start times are assumptions of the emulation, not
#: measurements. Weights load time comes from placement's ``ModelLocality``
#: (see ``FleetShape``), so ``load_s`` is the engine's own start only.
LARGE = dataclasses.replace(
    profile("llama2-13b-a100"),
    name="llama2-70b-4xa100 (emulated)",
    prefill_tps=6000.0,
    tpot_base_s=0.040,
    tpot_per_seq_s=0.0004,
    kv_bytes_per_token=327_680,
    kv_capacity_tokens=520_000,
    max_running=128,
    load_s=2.0,
)
#: fp16 weights of a 70B-parameter model
LARGE_WEIGHTS_BYTES = 140 * 10**9


@dataclass(frozen=True)
class FleetShape:
    """The emulated cluster: nodes, GPU slots, the weight cache. All
    emulated; the figures are assumptions named here."""

    nodes: int = 210
    gpus_per_node: int = 8
    gpus_per_instance: int = 4
    #: models whose weights a node keeps in host memory (LRU), e.g. 4 x
    #: 140 GB of a 1 TB host
    cache_models: int = 4
    #: the model store's link: 25 Gbit/s (a cold load of 140 GB: ~45 s)
    store_bps: float = 25e9 / 8
    #: host memory to GPU (PCIe 4 x16, ~16 GB/s: a warm load ~9 s)
    memory_bps: float = 16e9
    weights_bytes: int = LARGE_WEIGHTS_BYTES


@dataclass(frozen=True)
class Job:
    """One request of one function."""

    arrive: float
    function: int
    prompt_tokens: int
    max_tokens: int


def _stamp(s: str) -> float:
    # (fromisoformat takes at most 6 fractional digits; the trace has 7)
    stamp, _, frac = s.partition(".")
    return datetime.fromisoformat(stamp).timestamp() + float(f"0.{frac}")


@functools.lru_cache(maxsize=4)
def read_trace(paths: tuple[Path, ...], minutes: float) -> tuple[tuple[float, int, int], ...]:
    """(seconds from the first arrival, context tokens, generated tokens)
    of the merged traces' first ``minutes``, in time order (cached: every
    policy of a comparison replays the same trace)."""
    rows: list[tuple[float, int, int]] = []
    for path in paths:
        with path.open() as f:
            first: float | None = None
            for r in csv.DictReader(f):
                t = _stamp(r["TIMESTAMP"])
                first = t if first is None else first
                # Each file is in time order and the merged start is no
                # later than this file's: nothing further can be kept.
                if t - first > minutes * 60:
                    break
                rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    rows.sort()
    t0 = rows[0][0] if rows else 0.0
    return tuple((t - t0, c, max(1, g)) for t, c, g in rows if t - t0 <= minutes * 60)


def zipf_weights(n: int, s: float) -> list[float]:
    """Cumulative Zipf(s) weights over n ranks (rank 0 the most popular)."""
    return list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n)))


def workload(
    minutes: float, functions: int, speed: float, zipf_s: float = 1.0, seed: int = 1
) -> list[Job]:
    """The fleet workload (see the module docstring)."""
    rnd = random.Random(seed)
    cum = zipf_weights(functions, zipf_s)
    jobs = []
    for t, ctx, gen in read_trace(TRACES, minutes * speed):
        f = bisect.bisect_left(cum, rnd.random() * cum[-1])
        jobs.append(Job(t / speed, min(f, functions - 1), ctx, gen))
    return jobs
