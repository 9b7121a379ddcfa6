"""Fit the small emulated profile to the real model on this machine.

    python -m controlplane.llm.fitprofile --model examples/models/gemma-3-270m-q4_k_m.gguf

Measures Gemma 3 270M on llama.cpp (the runtime's settings: one thread,
``n_ctx`` 2048) and fits the emulated engine's parameters by least squares:

* **prefill**: seconds to evaluate an n-token prompt from an empty context,
  for n from 32 to 1,024; ``t = overhead + n / prefill_tps``.
* **TPOT vs batch**: the emulated engine's decode step is
  ``tpot_base_s + tpot_per_seq_s x batch``. llama.cpp's server here runs one
  sequence at a time, so a step of b sequences is measured as its work: one
  evaluation of b new tokens after a 64-token context (the same matrix
  products; the attention reads one context instead of b). b = 1 is a real
  decode step.
* **KV bytes per token**: the size of llama.cpp's per-sequence state
  (``llama_state_seq_get_size``, what a prefill instance exports) after n
  tokens; the slope over n <= 512. Gemma 3's sliding-window layers stop
  growing past 512 tokens, which the 1,024-token residual shows.
* **load time**: constructing the model from a warm page cache (wall time).

Evaluation times are the process's CPU seconds, not wall time: on this
shared machine (load averages of 20-40 from other work) a thread waits for a
core most of the time, and the profile is of the model on a core of its
own, which is what CPU time measures. The wall times are kept beside the
points (``points.wall``) to show the difference.

Each point is the median of ``--trials``. The fit, the points and the
residuals go to ``controlplane/llm/fits/gemma3-270m-cpu.json`` (``--out``),
from which ``profiles.py`` builds the profile: the numbers live in one file.
``fit`` is pure, so a test re-fits the committed points.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FIT_FILE = Path(__file__).resolve().parent / "fits" / "gemma3-270m-cpu.json"
PROMPT_SIZES = (32, 64, 128, 256, 512, 1024)
BATCHES = (1, 2, 4, 8, 16)
CONTEXT = 64
#: Gemma 3's local layers attend to the last 512 tokens only
SLIDING_WINDOW = 512


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y on x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    return my - slope * mx, slope


def residuals(
    points: list[tuple[float, float]], intercept: float, slope: float
) -> list[dict[str, float]]:
    """Each point's measured value, fitted value and relative residual."""
    out = []
    for x, y in points:
        f = intercept + slope * x
        out.append({"x": x, "measured": y, "fitted": f, "relative": (y - f) / f if f else 0.0})
    return out


def fit(points: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """The profile's parameters and the residuals of each fit, from measured
    points (``prefill``: [tokens, s], ``decode_step``: [batch, s],
    ``kv_state``: [tokens, bytes], ``load_s``: [s]; KV fitted within the
    sliding window, residuals of every point)."""
    pre = [(float(x), float(y)) for x, y in points["prefill"]]
    dec = [(float(x), float(y)) for x, y in points["decode_step"]]
    kv = [(float(x), float(y)) for x, y in points["kv_state"]]
    p0, p1 = line(pre)
    d0, d1 = line(dec)
    # Within the sliding window every layer grows by the token: the engine's
    # model (a constant per token). Past it only the global layers grow.
    k0, k1 = line([(x, y) for x, y in kv if x <= SLIDING_WINDOW])
    params = {
        "prefill_tps": 1.0 / p1,
        "prefill_overhead_s": p0,
        "tpot_base_s": d0,
        "tpot_per_seq_s": d1,
        "kv_bytes_per_token": k1,
        "kv_bytes_base": k0,
        "load_s": statistics.median(float(x) for x in points["load_s"]),
    }
    res = {
        "prefill": residuals(pre, p0, p1),
        "decode_step": residuals(dec, d0, d1),
        "kv_state": residuals(kv, k0, k1),
    }
    return params, res


def measure(model: str, threads: int, trials: int) -> dict[str, Any]:
    """Run the real model and return the measured points."""
    import llama_cpp

    def load() -> tuple[Any, float]:  # wall time: loading waits on the page cache too
        t0 = time.perf_counter()
        llm = llama_cpp.Llama(
            model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512,
            use_mmap=True, verbose=False,
        )  # fmt: skip
        return llm, time.perf_counter() - t0

    loads = []
    for _ in range(trials):
        llm, s = load()
        loads.append(s)
        del llm
    llm, _ = load()
    text = " ".join(f"word{i % 97} and" for i in range(2000))
    tokens = list(llm.tokenize(text.encode()))[: max(PROMPT_SIZES) + CONTEXT]

    def fresh() -> None:
        llm.reset()
        llm._ctx.kv_cache_clear()

    wall: dict[str, list[list[float]]] = {"prefill": [], "decode_step": []}

    def timed(what: str, x: int, n_ctx_tokens: list[int], new: list[int]) -> list[float]:
        """[x, median CPU seconds of evaluating ``new``]; the wall times' median
        goes to ``wall``."""
        cpu, walls = [], []
        for _ in range(trials):
            fresh()
            if n_ctx_tokens:
                llm.eval(n_ctx_tokens)
            c0, w0 = time.process_time(), time.perf_counter()
            llm.eval(new)
            cpu.append(time.process_time() - c0)
            walls.append(time.perf_counter() - w0)
        wall[what].append([x, statistics.median(walls)])
        return [x, statistics.median(cpu)]

    fresh()
    llm.eval(tokens[:16])  # warm the compute buffers
    prefill, kv = [], []
    for n in PROMPT_SIZES:
        prefill.append(timed("prefill", n, [], tokens[:n]))
        size = llama_cpp.llama_state_seq_get_size(llm._ctx.ctx, ctypes.c_int32(0))
        kv.append([n, int(size)])
    ctx = tokens[:CONTEXT]
    step = [timed("decode_step", b, ctx, tokens[CONTEXT : CONTEXT + b]) for b in BATCHES]
    return {"prefill": prefill, "decode_step": step, "kv_state": kv, "load_s": loads,
            "wall": wall}  # fmt: skip


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    """Measure, fit, write the fit file, print the fit."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the Gemma 3 270M GGUF file")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", default=str(FIT_FILE))
    a = p.parse_args(argv)
    if not Path(a.model).is_file():
        p.error(f"--model: no file {a.model}")
    if not 1 <= a.threads <= 64 or not 1 <= a.trials <= 100:
        p.error("--threads 1..64, --trials 1..100")
    load_before = os.getloadavg()[0]
    points = measure(a.model, a.threads, a.trials)
    params, res = fit(points)
    doc = {
        "model": "Gemma 3 270M, Q4_K_M GGUF, llama.cpp (llama-cpp-python)",
        "measured": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "commit": _commit(),
            "threads": a.threads,
            "trials": a.trials,
            "cpus": os.cpu_count(),
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "command": "python -m controlplane.llm.fitprofile --model MODEL "
            f"--threads {a.threads} --trials {a.trials}",
        },
        "points": points,
        "fit": params,
        "residuals": res,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(params, indent=1))
    for name, rows in res.items():
        worst = max(abs(r["relative"]) for r in rows)
        print(f"{name}: worst residual {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
