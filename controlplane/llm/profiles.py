"""Profiles of the emulated LLM engine: each names where its numbers come
from. ``kv_bytes_per_token`` is arithmetic on the model's published
configuration (2 (K and V) x layers x KV heads x head size x 2 bytes in
fp16); throughput figures are measured or marked as assumptions."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.llm.engine import Profile

#: the fit of the small profile to the real model (``python -m controlplane.llm.fitprofile``)
FIT_FILE = Path(__file__).resolve().parent / "fits" / "gemma3-270m-cpu.json"


def fitted(path: Path = FIT_FILE) -> tuple[Profile, str]:
    """The profile whose timing and KV numbers are the fit in ``path`` (no
    number of the fit is repeated here); batch and KV capacity are assumed."""
    doc = json.loads(path.read_text())
    f, m = doc["fit"], doc["measured"]
    prof = Profile(
        name="gemma3-270m-cpu",
        prefill_tps=f["prefill_tps"],
        tpot_base_s=f["tpot_base_s"],
        tpot_per_seq_s=f["tpot_per_seq_s"],
        kv_bytes_per_token=round(f["kv_bytes_per_token"]),
        kv_capacity_tokens=32_768,
        max_running=16,
        load_s=f["load_s"],
    )
    source = (
        f"fitted to Gemma 3 270M on llama.cpp, {m['threads']} thread(s), on this machine "
        f"({m['date']}, commit {m['commit']}: {m['command']}; {path.name}); KV capacity "
        "and batch bound: assumed"
    )
    return prof, source


PROFILES: dict[str, tuple[Profile, str]] = {
    "gemma3-270m-cpu": fitted(),
    "smollm2-135m-cpu": (
        Profile(
            name="smollm2-135m-cpu",
            prefill_tps=2000.0,
            tpot_base_s=0.011,
            tpot_per_seq_s=0.004,
            # 30 layers x 3 KV heads x 64 x 2 x 2 bytes
            kv_bytes_per_token=23_040,
            kv_capacity_tokens=32_768,
            max_running=16,
            load_s=0.4,
            wake_s=0.05,
        ),
        "prefill 2,000 tokens/s: vLLM on this 2-core CPU with SmolLM2-135M (measured "
        "2026-11-28); decode ~90 tokens/s at batch 1: llama.cpp with Gemma 3 270M on 2 "
        "threads (measured 2026-11-28); wake 0.05 s: Gemma 3 270M's context rebuilt at "
        "n_ctx 2,048 (0.03-0.08 s, measured 2026-11-29, docs/llm.md); per-sequence "
        "decode cost and KV capacity: assumed",
    ),
    "llama2-13b-a100": (
        Profile(
            name="llama2-13b-a100",
            prefill_tps=8000.0,
            tpot_base_s=0.020,
            tpot_per_seq_s=0.0002,
            # 40 layers x 40 KV heads x 128 x 2 x 2 bytes = 819,200 (8.19 GB at 10k tokens)
            kv_bytes_per_token=819_200,
            # ~50 GB of an 80 GB A100 left for KV after 26 GB of fp16 weights
            kv_capacity_tokens=61_000,
            max_running=256,
            load_s=8.0,
            wake_s=0.4,
        ),
        "KV bytes per token from LLaMA-2-13B's configuration; KV capacity from an 80 GB "
        "A100 less 26 GB of weights; prefill, decode, load and wake times: assumptions of "
        "the emulation, not measurements (wake: load / 20, within the 18-200x faster wake "
        "than a reload that vLLM's sleep mode reports)",
    ),
}


def profile(name: str) -> Profile:
    """The profile called name; ValueError listing the known ones."""
    try:
        return PROFILES[name][0]
    except KeyError:
        raise ValueError(
            f"unknown LLM profile {name[:40]!r} (known: {', '.join(sorted(PROFILES))})"
        ) from None
