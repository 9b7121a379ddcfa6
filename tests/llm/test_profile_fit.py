"""The small emulated profile comes from its committed fit to the real model:
the fit re-computes from the committed points, and the profile's numbers are
the fit file's (changing the file changes the profile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.llm import fitprofile, profiles


def test_the_committed_fit_is_the_fit_of_the_committed_points() -> None:
    doc = json.loads(profiles.FIT_FILE.read_text())
    params, res = fitprofile.fit(doc["points"])
    assert params == pytest.approx(doc["fit"], rel=1e-9)
    assert res == pytest.approx(doc["residuals"], rel=1e-9)
    # Every measured point has its residual, the KV point past the window too.
    assert len(res["kv_state"]) == len(doc["points"]["kv_state"])


def test_the_profile_is_read_from_the_fit_file(tmp_path: Path) -> None:
    doc = json.loads(profiles.FIT_FILE.read_text())
    prof = profiles.profile("gemma3-270m-cpu")
    fit = doc["fit"]
    assert prof.prefill_tps == fit["prefill_tps"]
    assert prof.tpot_base_s == fit["tpot_base_s"]
    assert prof.tpot_per_seq_s == fit["tpot_per_seq_s"]
    assert prof.kv_bytes_per_token == round(fit["kv_bytes_per_token"])
    assert prof.load_s == fit["load_s"]
    # Another fit file, another profile: nothing of the fit is written twice.
    doc["points"]["prefill"] = [[n, 2 * s] for n, s in doc["points"]["prefill"]]
    doc["fit"], doc["residuals"] = fitprofile.fit(doc["points"])
    other = tmp_path / "fit.json"
    other.write_text(json.dumps(doc))
    changed, source = profiles.fitted(other)
    assert changed.prefill_tps == pytest.approx(prof.prefill_tps / 2)
    assert "fit.json" in source


def test_a_line_fit_recovers_its_line() -> None:
    pts = [(x, 0.5 + 0.25 * x) for x in (1.0, 2.0, 4.0, 8.0)]
    assert fitprofile.line(pts) == pytest.approx((0.5, 0.25))
    assert all(r["relative"] == pytest.approx(0) for r in fitprofile.residuals(pts, 0.5, 0.25))
