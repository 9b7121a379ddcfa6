"""The gateway's pure guards: the refusal log limiter (injected clock),
the upload budget, depth-limited JSON and CORS decisions."""

from __future__ import annotations

import pytest

from controlplane.gateway import cors, guard


def test_log_limiter_writes_one_line_per_kind_per_interval_and_counts_the_rest() -> None:
    lim = guard.LogLimiter(interval_s=1.0)
    assert lim.allow("route", 0.0) == (True, 0)
    assert lim.allow("route", 0.5) == (False, 0)
    assert lim.allow("route", 0.9) == (False, 0)
    assert lim.allow("body_size", 0.9) == (True, 0)  # kinds apart
    assert lim.allow("route", 1.0) == (True, 2)  # two held back since the last line
    assert lim.allow("route", 2.5) == (True, 0)


def test_upload_budget_refuses_what_does_not_fit_and_takes_nothing() -> None:
    b = guard.UploadBudget(100)
    assert b.take(60) and not b.take(41) and b.used == 60
    b.give(60)
    assert b.take(100) and b.used == 100


def test_json_depth_limit_is_a_clear_error_not_a_recursion_error() -> None:
    assert guard.parse_json(b"[" * 1000 + b"]" * 1000) is not None
    with pytest.raises(guard.BadJson, match="nested deeper than 1024"):
        guard.parse_json(b"[" * 100_000)
    with pytest.raises(guard.BadJson, match="not valid JSON"):
        guard.parse_json(b"\xff")


def test_cors_is_closed_by_default_and_open_to_listed_origins() -> None:
    asked = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    assert cors.is_preflight(asked) and not cors.is_preflight({"Origin": "x"})
    assert cors.Cors("").preflight(asked).status == 403
    assert cors.Cors("https://app.example/, https://b.example").preflight(asked).status == 204
    assert cors.Cors("*").allowed("https://anything.example")
    out: dict[str, str] = {}
    cors.Cors("https://b.example").decorate(asked, out)
    assert out == {}
    cors.Cors("https://app.example").decorate(asked, out)
    assert out["Access-Control-Allow-Origin"] == "https://app.example"
