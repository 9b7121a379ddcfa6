"""The real-model P/D bench's summary and row, on hand-made requests (the
bench itself needs the llm extra and minutes: `python -m
controlplane.bench.pdreal`, docs/llm.md)."""

from __future__ import annotations

import pytest

from controlplane.bench import pdreal


def test_the_summary_counts_what_was_disaggregated_and_takes_medians() -> None:
    rows = [
        {"e2e_s": e, "completion_tokens": n, "prefilled_elsewhere": moved}
        for e, n, moved in [(1.0, 4, True), (3.0, 4, True), (2.0, 0, False), (9.0, 4, True)]
    ]
    s = pdreal.summary(rows)
    assert s["n"] == 4 and s["disaggregated"] == 3
    assert s["e2e_p50_s"] == pytest.approx(2.5)
    assert s["e2e_p90_s"] == 9.0
    # per output token: 0.25, 0.75, 2.0 (no tokens: the whole E2E), 2.25
    assert s["per_token_p50_s"] == pytest.approx(1.375)
    line = pdreal.row(s | {"mix": "decode-heavy", "mode": "aggregated", "words": 20, "out": 48})
    assert line.startswith(
        "| decode-heavy (20 words in / 48 out) | aggregated | 4 | 3 | 2500 / 9000"
    )
