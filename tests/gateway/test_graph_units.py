"""Inference graph specs and the pure planner: no processes."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.gateway.graphs.planner import Call, Plan, holds
from controlplane.gateway.graphs.runner import load_dir
from controlplane.runtime import graphspec as spec
from controlplane.runtime.errors import InvalidArgument


def fn(name: str, function: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "function": function, **kw}


def graph(**nodes: Any) -> dict[str, Any]:
    return {"name": "g", "nodes": nodes}


ENSEMBLE = graph(
    root={"router": "Sequence", "steps": [
        fn("prep", "iris-prep"),
        {"name": "vote", "node": "classifiers", "data": "$response"},
    ]},
    classifiers={"router": "Ensemble", "steps": [fn("forest", "iris"), fn("tree", "iris-tree")]},
)  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"name": "g"}, "nodes:"),
        (graph(other={"router": "Sequence", "steps": [fn("a", "f")]}), "nodes.root: required"),
        (graph(root={"router": "Pipeline", "steps": [fn("a", "f")]}), "nodes.root.router"),
        (graph(root={"router": "Sequence", "steps": []}), "nodes.root.steps:"),
        (graph(root={"router": "Sequence", "steps": [{"name": "a"}]}), "nodes.root.steps[0]:"),
        (graph(root={"router": "Sequence", "steps": [fn("a", "F")]}), "steps[0].function"),
        (graph(root={"router": "Sequence", "steps": [fn("a", "f"), fn("a", "g")]}),
         "steps[1].name"),
        (graph(root={"router": "Sequence", "steps": [fn("a", "f", data="$response")]}),
         "steps[0].data"),
        (graph(root={"router": "Ensemble", "steps": [fn("a", "f", data="$response")]}),
         "steps[0].data"),
        (graph(root={"router": "Splitter", "steps": [fn("a", "f", weight=60), fn("b", "g",
         weight=30)]}), "must sum to 100, got 90"),
        (graph(root={"router": "Splitter", "steps": [fn("a", "f")]}), "steps[0].weight"),
        (graph(root={"router": "Switch", "steps": [fn("a", "f")]}), "steps[0].condition"),
        (graph(root={"router": "Switch", "steps": [fn("a", "f", condition={
            "pointer": "x", "op": "==", "value": 1})]}), "steps[0].condition.pointer"),
        (graph(root={"router": "Switch", "steps": [fn("a", "f", condition={
            "pointer": "/x", "op": "~", "value": 1})]}), "steps[0].condition.op"),
        (graph(root={"router": "Switch", "steps": [fn("a", "f", condition={
            "pointer": "/x", "op": "in", "value": 1})]}), "steps[0].condition.value"),
        (graph(root={"router": "Sequence", "steps": [fn("a", "f", timeout_ms=0)]}),
         "steps[0].timeout_ms"),
        (graph(root={"router": "Sequence", "steps": [fn("a", "f", retries=2)]}),
         "steps[0].retries: unknown field"),
        (graph(root={"router": "Sequence", "steps": [{"name": "a", "node": "nope"}]}),
         "steps[0].node: no node 'nope'"),
        (graph(root={"router": "Sequence", "steps": [{"name": "a", "node": "b"}]},
               b={"router": "Sequence", "steps": [{"name": "c", "node": "root"}]}),
         "makes a cycle (root -> b -> root)"),
        (graph(root={"router": "Sequence", "steps": [{"name": "a", "node": "root"}]}),
         "makes a cycle (root -> root)"),
    ],
)  # fmt: skip
def test_bad_specs_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        spec.parse(doc)
    assert field in str(e.value)


def test_fan_out_is_bounded() -> None:
    steps = [fn(f"s{i}", "f") for i in range(8)]
    nested = [{"name": f"n{i}", "node": "wide"} for i in range(9)]
    doc = graph(root={"router": "Ensemble", "steps": nested},
                wide={"router": "Ensemble", "steps": steps})  # fmt: skip
    with pytest.raises(InvalidArgument, match="72 function calls"):
        spec.parse(doc)


def run(plan: Plan, answer: Any) -> list[Call]:
    """Drive a plan to its end, answering each call with answer(call);
    the calls made, in order."""
    made: list[Call] = []
    todo = plan.start()
    while todo:
        c = todo.pop(0)
        made.append(c)
        todo += plan.answer(c, answer(c))
    return made


def test_sequence_passes_response_or_request() -> None:
    g = spec.parse(graph(root={"router": "Sequence", "steps": [
        fn("a", "fa"), fn("b", "fb", data="$response"), fn("c", "fc")]}))  # fmt: skip
    plan = Plan(g, {"x": 1}, random.random)
    made = run(plan, lambda c: {"from": c.function})
    assert [(c.step, c.body) for c in made] == [
        ("root.a", {"x": 1}), ("root.b", {"from": "fa"}), ("root.c", {"x": 1})
    ]  # fmt: skip
    assert plan.finished and plan.result == {"from": "fc"}
    assert made[0].path == "/v1/models/fa:predict"


def test_ensemble_starts_all_at_once_and_keeps_spec_order() -> None:
    plan = Plan(spec.parse(ENSEMBLE), {"instances": [[1, 2, 3, 4]]}, random.random)
    first = plan.start()
    assert [c.step for c in first] == ["root.prep"]
    both = plan.answer(first[0], {"instances": [[0.5]]})
    assert [(c.step, c.body) for c in both] == [
        ("root.vote.forest", {"instances": [[0.5]]}), ("root.vote.tree", {"instances": [[0.5]]})
    ]  # fmt: skip
    assert plan.answer(both[1], {"predictions": [2]}) == []  # the tree answers first
    assert not plan.finished
    assert plan.answer(both[0], {"predictions": [1]}) == []
    assert plan.finished
    assert list(plan.result) == ["forest", "tree"]
    assert plan.result == {"forest": {"predictions": [1]}, "tree": {"predictions": [2]}}


def test_splitter_draws_by_weight() -> None:
    g = spec.parse(graph(root={"router": "Splitter", "steps": [
        fn("a", "fa", weight=20), fn("b", "fb", weight=0), fn("c", "fc", weight=80)]}))  # fmt: skip
    for x, want in ((0.0, "fa"), (0.1999, "fa"), (0.2, "fc"), (0.9999999, "fc")):
        assert Plan(g, {}, functools.partial(float, x)).start()[0].function == want


@pytest.mark.parametrize(
    ("op", "value", "doc", "want"),
    [
        ("==", "a", {"k": "a"}, True),
        ("!=", "a", {"k": "a"}, False),
        ("<", 5, {"k": 4.9}, True),
        ("<=", 5, {"k": 5}, True),
        (">", 5, {"k": 5}, False),
        (">=", 5, {"k": 5}, True),
        ("in", ["x", "y"], {"k": "y"}, True),
        ("<", 5, {"k": "four"}, False),  # does not compare: does not hold
        ("==", 1, {"other": 1}, False),  # resolves to nothing: null
        ("!=", 1, {"other": 1}, True),
        ("==", None, {"other": 1}, True),
        ("<", 1, {"other": 1}, False),
        ("==", 1, [1], False),
    ],
)
def test_switch_conditions(op: str, value: Any, doc: Any, want: bool) -> None:
    assert holds(spec.Condition("/k", op, value), doc) is want


def test_switch_first_match_and_no_match_answers_input() -> None:
    g = spec.parse(graph(root={"router": "Switch", "steps": [
        fn("small", "fs", condition={"pointer": "/instances/0/0", "op": "<", "value": 5}),
        fn("any", "fa", condition={"pointer": "/instances/0/0", "op": ">", "value": 0}),
    ]}))  # fmt: skip
    assert Plan(g, {"instances": [[4]]}, random.random).start()[0].function == "fs"
    assert Plan(g, {"instances": [[7]]}, random.random).start()[0].function == "fa"
    plan = Plan(g, {"instances": [["n/a"]]}, random.random)
    assert plan.start() == []
    assert plan.finished and plan.result == {"instances": [["n/a"]]}


def test_bad_graph_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(ENSEMBLE))
    bad = graph(root={"router": "Sequence", "steps": [fn("x", "f", weight=5)]})
    (tmp_path / "zz-bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"zz-bad.yaml: nodes.root.steps\[0\].weight: only in"):
        load_dir(str(tmp_path))
    (tmp_path / "zz-bad.yaml").unlink()
    assert list(load_dir(str(tmp_path))) == ["g"]
