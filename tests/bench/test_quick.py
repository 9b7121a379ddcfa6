"""The short form of a bench file (`galaxy bench --quick`): a pure rewrite of
the YAML document that the plan's own validation then checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.bench import plan as pl
from controlplane.bench.quick import QUICK_NODES, QUICK_REQUESTS, QUICK_WARMUP, shorten

REPO = Path(__file__).resolve().parents[2]


def test_shorten_bounds_nodes_requests_and_keeps_one_configuration() -> None:
    doc: dict[str, Any] = {
        "name": "x",
        "control_plane": {"nodes": 210, "dispatch": 2},
        "load": {"echo_requests": 8000, "concurrency": 16},
        "parameters": [{"name": "nodes", "value": [210, 10]}, {"name": "gc", "value": [True]}],
        "scenarios": [{"name": "a", "total_requests": 12000, "warmup_requests": 2000},
                      {"name": "b", "total_requests": 3, "max_duration_s": 500}],
    }  # fmt: skip
    short = shorten(doc)
    assert short["control_plane"] == {"nodes": QUICK_NODES, "dispatch": 2}
    assert short["load"]["echo_requests"] < 8000 and short["load"]["concurrency"] == 16
    assert short["parameters"] == [
        {"name": "nodes", "value": [QUICK_NODES]},
        {"name": "gc", "value": [True]},
    ]
    a, b = short["scenarios"]
    assert (a["total_requests"], a["warmup_requests"]) == (QUICK_REQUESTS, QUICK_WARMUP)
    assert b["total_requests"] == 3 and b["max_duration_s"] < 500  # smaller values stay
    assert doc["control_plane"]["nodes"] == 210  # the input is not changed


@pytest.mark.parametrize("doc", [None, [], {"scenarios": "x", "parameters": [1]}])
def test_shorten_leaves_other_shapes_for_validation_to_name(doc: object) -> None:
    assert shorten(doc) == doc


def test_every_shipped_plan_is_valid_in_its_short_form() -> None:
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        if "\nkind:" in path.read_text():  # an LLM or model bench: its own format
            continue
        bf = pl.load_file(path, quick=True)
        assert bf.control_plane["nodes"] <= QUICK_NODES, path.name
        assert all(len(v) == 1 for v in bf.experiment.parameters.values()), path.name
        assert all(s.total_requests <= QUICK_REQUESTS for s in bf.experiment.scenarios)
