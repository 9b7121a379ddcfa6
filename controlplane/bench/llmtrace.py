"""The Azure LLM inference trace 2023 (Splitwise, ISCA 2024; CC-BY 4.0) as an
open-loop schedule: arrival time, prompt tokens and output tokens per request.

A window of the trace's real arrivals is taken and time-scaled: ``time_scale``
multiplies every gap (0.5 replays twice as fast, 4 four times slower), so the
bursts keep their shape. Token counts may be scaled and capped too, for a
machine that cannot prefill the trace's 1,155-token mean prompt at its rate
(the real small model on 2 cores); the report states every factor.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.bench.trace import TraceError

DIR = "azure-llm-inference-2023"
FILES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}


@dataclass(frozen=True)
class TraceWindow:
    """Which requests of the trace to replay, and how they are scaled."""

    service: str = "conv"  # conv or code
    start_s: float = 0.0  # offset of the window from the trace's first arrival
    duration_s: float = 60.0  # window length in trace seconds
    time_scale: float = 1.0  # replayed gap = trace gap x time_scale
    token_scale: float = 1.0  # tokens = trace tokens x token_scale (then capped)
    max_prompt_tokens: int = 8192
    max_output_tokens: int = 1024

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceWindow:
        """From a bench file's ``trace:`` mapping; errors name the field."""
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(d) - known)
        if bad:
            raise TraceError(f"trace.{bad[0]}: unknown option (known: {', '.join(sorted(known))})")
        w = cls(**{k: type(getattr(cls, k))(v) for k, v in d.items()})
        if w.service not in FILES:
            raise TraceError(f"trace.service: one of {', '.join(FILES)}")
        for k in ("duration_s", "time_scale", "token_scale"):
            if not getattr(w, k) > 0:
                raise TraceError(f"trace.{k}: must be > 0")
        if w.start_s < 0 or w.max_prompt_tokens < 1 or w.max_output_tokens < 1:
            raise TraceError("trace: start_s >= 0 and max_*_tokens >= 1")
        return w


@dataclass(frozen=True)
class LlmRequest:
    """One request to send: when (s from the start), prompt and output tokens."""

    at_s: float
    prompt_tokens: int
    output_tokens: int
    #: the prompt to send in text form ("": ``prompt_tokens`` common words)
    text: str = ""
    #: the prompt's block ids, shared between requests with a common prefix
    #: (the emulated server's ``galaxy_prefix_blocks``); () for none
    prefix_blocks: tuple[str, ...] = ()


def _ts(text: str) -> float:
    # 7 fractional digits: strptime's %f takes 6, so parse the fraction apart.
    whole, _, frac = text.strip().partition(".")
    return datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + (frac or "0"))


def load(data_dir: Path, w: TraceWindow) -> list[LlmRequest]:
    """The window's requests, time- and token-scaled, in arrival order."""
    path = data_dir / DIR / FILES[w.service]
    if not path.is_file():
        raise TraceError(f"trace: {path} not found (see ../shared/data/{DIR}/README.md)")
    out: list[LlmRequest] = []
    t0: float | None = None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                t = _ts(row["TIMESTAMP"])
                ctx, gen = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (KeyError, ValueError) as e:
                raise TraceError(f"trace: {path.name}: malformed row ({type(e).__name__})") from e
            t0 = t if t0 is None else t0
            rel = t - t0 - w.start_s
            if rel < 0:
                continue
            if rel >= w.duration_s:
                break
            out.append(
                LlmRequest(
                    at_s=rel * w.time_scale,
                    prompt_tokens=max(1, min(w.max_prompt_tokens, round(ctx * w.token_scale))),
                    output_tokens=max(1, min(w.max_output_tokens, round(gen * w.token_scale))),
                )
            )
    if not out:
        raise TraceError("trace: the window holds no request (start_s/duration_s)")
    base = out[0].at_s
    return [LlmRequest(r.at_s - base, r.prompt_tokens, r.output_tokens) for r in out]
