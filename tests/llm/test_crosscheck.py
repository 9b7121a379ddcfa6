"""The guidellm cross-check's arithmetic (``bench/llmcrosscheck.py``):
guidellm reports TTFT and ITL in ms and request latency in seconds, and its
ITL is the bench's TPOT; the figures must land in the bench's units and
names, and the verdict must fail when one figure is off by more than 10%.
(The cross-check itself needs guidellm in its own virtualenv: docs/llm.md.)"""

from __future__ import annotations

import pytest

from controlplane.bench import llmcrosscheck as cc


def _record(ttft_ms: float, itl_ms: float, latency_s: float) -> dict[str, float]:
    return {
        "time_to_first_token_ms": ttft_ms,
        "inter_token_latency_ms": itl_ms,
        "request_latency": latency_s,
        "time_per_output_token_ms": (latency_s * 1000) / 50,
    }


def test_guidellm_units_and_names_become_the_bench_s() -> None:
    recs = [_record(20.0, 15.0, 0.8), _record(30.0, 17.0, 1.0)]
    got = cc.guidellm_figures(recs)
    assert got["ttft"]["mean"] == pytest.approx(25.0)  # ms stays ms
    assert got["tpot"]["mean"] == pytest.approx(16.0)  # its ITL is our TPOT
    assert got["e2e"]["mean"] == pytest.approx(900.0)  # seconds become ms
    assert got["tpot_incl_first"]["mean"] == pytest.approx(18.0)
    assert got["ttft"]["count"] == 2


def test_the_verdict_fails_past_ten_percent() -> None:
    theirs = cc.guidellm_figures([_record(20.0, 15.0, 0.8)] * 3)
    same = {k: dict(v) for k, v in theirs.items() if k != "tpot_incl_first"}
    assert cc.within(same, theirs)
    off = {k: dict(v) for k, v in same.items()}
    off["tpot"]["p50"] *= 1.11
    assert not cc.within(off, theirs)
    table = cc.compare(off, theirs)
    assert any(line.startswith("| tpot p50 |") and "1.110" in line for line in table)
