"""The LLM bench's metric definitions on hand-built token timestamps (pure)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from controlplane.bench import llmmetrics as mt
from controlplane.bench import llmtrace as tr
from controlplane.bench.trace import TraceError


def _rec(sent: float, chunks: list[float], done: float, n: int = 0, p: int = 10) -> mt.Record:
    return mt.Record(sent=sent, prompt_tokens=p, output_tokens=n, chunks=chunks, done=done)


def test_ttft_tpot_itl_e2e_of_one_stream() -> None:
    # Sent at 1.0; tokens at 1.5, 1.6, 1.8, 2.1; the stream ends at 2.1.
    r = _rec(1.0, [1.5, 1.6, 1.8, 2.1], 2.1)
    assert r.ttft() == pytest.approx(0.5)
    assert r.e2e() == pytest.approx(1.1)
    # TPOT excludes the first token: (2.1 - 1.5) / (4 - 1).
    assert r.tpot() == pytest.approx(0.2)
    assert r.itls() == pytest.approx([0.1, 0.2, 0.3])


def test_tpot_uses_the_servers_token_count_and_none_for_one_token() -> None:
    # Six tokens by usage though four chunks arrived (a server may batch).
    assert _rec(0.0, [0.5, 0.7, 0.9, 1.5], 1.5, n=6).tpot() == pytest.approx(0.2)
    assert _rec(0.0, [0.4], 0.4).tpot() is None


def test_summary_pools_itl_and_counts_goodput_within_limits() -> None:
    a = _rec(0.0, [0.2, 0.3, 0.4], 0.4, n=3, p=100)  # TTFT 0.2, TPOT 0.1
    b = _rec(0.0, [1.5, 1.55], 1.55, n=2, p=50)  # TTFT 1.5: misses TTFT <= 1
    c = _rec(1.0, [1.1, 1.9], 1.9, n=2, p=20)  # TPOT 0.8: misses TPOT <= 0.5
    d = mt.Record(sent=2.0, error="http 429")
    s = mt.summarize([a, b, c, d], wall_s=2.0, limits=mt.Limits(ttft_s=1.0, tpot_s=0.5))
    assert s["requests"] == {"sent": 4, "ok": 3, "errors": 1}
    assert s["errors_by_kind"] == {"http 429": 1}
    ttft = s["latency_ms"]["ttft"]
    assert ttft["count"] == 3
    assert ttft["mean"] == pytest.approx(np.mean([200, 1500, 100]))
    assert ttft["p50"] == pytest.approx(200)
    assert ttft["p99"] == pytest.approx(np.percentile([200, 1500, 100], 99))
    assert ttft["stddev"] == pytest.approx(np.std([200, 1500, 100]))
    # ITL pools every gap: 2 from a, 1 from b, 1 from c.
    assert s["latency_ms"]["itl"]["count"] == 4
    assert s["latency_ms"]["tpot"]["count"] == 3
    t = s["throughput"]
    assert t["goodput_per_s"] == pytest.approx(0.5)  # only a, over 2 s
    assert t["goodput_share"] == pytest.approx(0.25)
    assert t["input_tokens_per_s"] == pytest.approx(170 / 2)
    assert t["output_tokens_per_s"] == pytest.approx(7 / 2)


def test_empty_summary_is_nan_not_an_error() -> None:
    s = mt.summarize([], wall_s=0.0, limits=mt.Limits())
    assert s["latency_ms"]["ttft"]["count"] == 0
    assert math.isnan(s["latency_ms"]["ttft"]["p99"])
    assert math.isnan(s["throughput"]["requests_per_s"])


def test_objectives_parse_and_judge() -> None:
    objs = mt.parse_objectives("p99_ttft<1s, p90_tpot<=100ms, goodput_share>=0.9")
    assert [(o.stat, o.metric, o.limit) for o in objs] == [
        ("p99", "ttft", 1000.0),
        ("p90", "tpot", 100.0),
        ("", "goodput_share", 0.9),
    ]
    fast = _rec(0.0, [0.1, 0.15], 0.15)
    s = mt.summarize([fast], 1.0, mt.Limits(1.0, 0.1))
    assert all(o.met(s) for o in objs)
    slow = mt.summarize([_rec(0.0, [2.0, 2.05], 2.05)], 1.0, mt.Limits(1.0, 0.1))
    assert not objs[0].met(slow)
    with pytest.raises(mt.ObjectiveError, match="p99_ttft<1s"):
        mt.parse_objectives("p99_latency<1s")


def test_trace_window_is_time_and_token_scaled(tmp_path: Path) -> None:
    d = tmp_path / tr.DIR
    d.mkdir()
    (d / tr.FILES["conv"]).write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,100,10\n"
        "2023-11-16 18:15:47.5000000,3000,400\n"
        "2023-11-16 18:15:49.0000000,50,5\n"
        "2023-11-16 18:15:59.0000000,50,5"
    )
    w = tr.TraceWindow(duration_s=5, time_scale=0.5, token_scale=0.5, max_prompt_tokens=1000)
    reqs = tr.load(tmp_path, w)
    assert [r.at_s for r in reqs] == pytest.approx([0.0, 0.75, 1.5])
    assert [r.prompt_tokens for r in reqs] == [50, 1000, 25]
    assert [r.output_tokens for r in reqs] == [5, 200, 2]


def test_trace_options_name_the_field() -> None:
    with pytest.raises(TraceError, match=r"trace\.speed"):
        tr.TraceWindow.from_dict({"speed": 2})
    with pytest.raises(TraceError, match=r"trace\.time_scale"):
        tr.TraceWindow.from_dict({"time_scale": 0})
