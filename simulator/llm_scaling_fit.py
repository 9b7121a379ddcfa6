"""Per-instance scaling targets fitted to an emulated engine on a request
mix (``python -m simulator.llm_scaling --fit``): one engine kept at each
concurrency in turn, the largest that still serves nearly all it serves
alone within the SLO, and what every other metric reads there."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.llm.engine import Engine, Profile, Request

#: candidate per-instance concurrencies ``fit`` tries, smallest first
FIT_LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class Fit:
    """One engine's capacity on a request mix at the SLO, and what each
    metric reads there: the per-instance targets ``fit`` derives."""

    concurrency: int
    queue: float
    kv: float
    tokens_per_s: float


def _closed_loop(
    mix: list[tuple[float, int, int]],
    prof: Profile,
    level: int,
    slo: tuple[float, float],
    finishes: int,
) -> tuple[float, float, float, float]:
    """One engine kept at ``level`` requests in flight (drawn from ``mix`` in
    turn) until ``finishes`` finish: the fraction within both SLOs, and the
    mean queue, KV use and generated tokens/s over time."""
    e = Engine(prof)
    now, k, good, done = 0.0, 0, 0, 0
    area_q = area_kv = 0.0

    def submit() -> None:
        nonlocal k
        _, ctx, gen = mix[k % len(mix)]
        k += 1
        e.submit(Request(str(k), min(ctx, prof.kv_capacity_tokens // 2), gen, arrived=now))

    for _ in range(level):
        submit()
    while done < finishes:
        step = e.plan(now)
        assert step is not None  # never idle: a finish is replaced at once
        area_q += (len(e.waiting) + len(e.running)) * step.duration
        area_kv += e.kv_usage * step.duration
        now = step.ends
        for r in e.complete(step):
            if r.finished_at is not None and r.first_token_at is not None:
                ttft = r.first_token_at - r.arrived
                tpot = (r.finished_at - r.first_token_at) / max(1, r.generated - 1)
                good += int(ttft <= slo[0] and tpot <= slo[1])
                done += 1
                submit()
    return good / done, area_q / now, area_kv / now, e.counters.generation_tokens / now


def fit(
    mix: list[tuple[float, int, int]],
    prof: Profile,
    slo: tuple[float, float],
    finishes: int = 400,
    keep: float = 0.9,
) -> Fit:
    """Per-instance targets fitted to the emulated engine: the largest
    concurrency (of ``FIT_LEVELS``) at which one engine, kept that busy with
    this mix, still serves at least ``keep`` of the share within both SLOs
    it serves alone (some prompts miss the TTFT target even alone), and the
    queue, KV use and tokens/s it shows there. Every metric, concurrency
    included, is then aimed at the same operating point, so none is
    favoured by a default that suits another profile."""
    alone, q, kv, rate = _closed_loop(mix, prof, 1, slo, finishes)
    best = Fit(1, q, kv, rate)
    for level in FIT_LEVELS[1:]:
        if level > prof.max_running:
            break
        share, q, kv, rate = _closed_loop(mix, prof, level, slo, finishes)
        if share < keep * alone:
            break
        best = Fit(level, q, kv, rate)
    return best
