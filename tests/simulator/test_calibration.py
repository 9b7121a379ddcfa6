"""The calibration file and its samplers."""

import json
import random
import statistics

import pytest

from simulator import calibration as cb


def test_default_calibration_has_every_op_with_a_source(cal):
    assert set(cb.OPS) <= set(cal.ops)
    for name, op in cal.ops.items():
        assert op.mean_s > 0 and op.source, name
    for name in ("connect_s", "repartition_s", "control_start_s"):
        assert cal.param(name) > 0 and cal.sources[name], name


def test_sampler_has_the_op_mean_and_cv(cal):
    op = next(iter(cal.ops))
    c = cal.ops[op]
    draw = cal.sampler(op, random.Random(1))
    xs = [draw() for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(c.mean_s, rel=0.03)
    if c.cv:
        assert statistics.stdev(xs) / statistics.fmean(xs) == pytest.approx(c.cv, rel=0.1)


def test_files_round_trip_and_errors_name_the_entry(tmp_path, cal):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cal.to_json()))
    again = cb.load(p)
    assert again.ops == cal.ops and again.params == cal.params
    doc = cal.to_json()
    del doc["ops"]["dispatch.dispatch"]
    p.write_text(json.dumps(doc))
    with pytest.raises(cb.CalibrationError, match=r"dispatch\.dispatch"):
        cb.load(p)
    with pytest.raises(cb.CalibrationError, match="cannot read"):
        cb.load(tmp_path / "missing.json")
