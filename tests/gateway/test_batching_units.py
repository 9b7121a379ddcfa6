"""The adaptive batching policy (injected clock) and the v1/v2 merge and
split: no processes."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.gateway.batchcodec import BadAnswer, Part, Unbatchable, merge, part, split
from controlplane.gateway.batching import BatchPolicy, Decision


def test_idle_function_sends_at_once() -> None:
    p = BatchPolicy(max_batch_size=8, max_latency_s=0.010, parallel=1, max_queue=10)
    assert p.admit(1, now=0.0)
    assert p.decide(0.0) == Decision(send=1)  # a lone request waits for nothing


def test_busy_function_waits_for_a_return_or_the_limit() -> None:
    p = BatchPolicy(max_batch_size=8, max_latency_s=0.010, parallel=1, max_queue=10)
    p.admit(1, 0.0)
    p.sent(p.decide(0.0).send)  # the slot is busy now
    p.admit(2, 0.001)
    p.admit(3, 0.002)
    # Gathering while busy: wake when the first waiter's limit is up.
    assert p.decide(0.002) == Decision(wake_at=pytest.approx(0.011))
    p.returned()  # the slot frees: what gathered goes, before the limit
    assert p.decide(0.004) == Decision(send=2)
    p.sent(2)
    p.admit(1, 0.005)
    assert p.decide(0.005).send == 0
    assert p.decide(0.015) == Decision(send=1)  # the limit, still busy


def test_full_batch_goes_while_busy_and_big_requests_go_alone() -> None:
    p = BatchPolicy(max_batch_size=4, max_latency_s=1.0, parallel=1, max_queue=10)
    p.admit(1, 0.0)
    p.sent(p.decide(0.0).send)
    for rows in (2, 2, 3):
        p.admit(rows, 0.1)
    assert p.decide(0.1) == Decision(send=2)  # 2 + 2 rows fill it; the 3 waits
    p.sent(2)
    assert p.decide(0.1).send == 0
    p.admit(9, 0.2)  # larger than a batch: goes alone, never split
    p.returned()
    p.returned()
    assert p.decide(0.2) == Decision(send=1)
    p.sent(1)
    assert p.decide(0.2) == Decision(send=1)  # the 9 rows, alone


def test_queue_is_bounded() -> None:
    p = BatchPolicy(max_batch_size=4, max_latency_s=1.0, parallel=1, max_queue=2)
    assert p.admit(1, 0.0) and p.admit(1, 0.0)
    assert not p.admit(1, 0.0)
    assert p.rows == [1, 1]


def v2(name: str, rows: list[list[float]]) -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": [len(rows), len(rows[0])],
                        "data": [x for r in rows for x in r]}]}  # fmt: skip


def test_v1_each_caller_gets_its_rows() -> None:
    parts = [part("v1", {"instances": [[1], [2]]}), part("v1", {"instances": [[3]]})]
    assert merge(parts) == {"instances": [[1], [2], [3]]}
    assert split(parts, {"predictions": ["a", "b", "c"]}) == [
        {"predictions": ["a", "b"]}, {"predictions": ["c"]}
    ]  # fmt: skip
    with pytest.raises(BadAnswer, match="3 rows"):
        split(parts, {"predictions": ["a", "b"]})


def test_v2_each_caller_gets_its_rows() -> None:
    a, b = v2("input-0", [[1, 2], [3, 4]]), v2("input-0", [[5, 6]])
    parts = [part("v2", a), part("v2", b)]
    assert parts[0].key == parts[1].key
    assert merge(parts)["inputs"] == [
        {"name": "input-0", "datatype": "FP32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}
    ]
    outputs = [
        {"name": "output-0", "datatype": "INT64", "shape": [3], "data": [7, 8, 9]},
        {"name": "proba", "datatype": "FP32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]},
    ]
    answer = {"model_name": "iris", "outputs": outputs}
    mine, theirs = split(parts, answer)
    assert mine["model_name"] == "iris"
    assert [o["data"] for o in mine["outputs"]] == [[7, 8], [1, 2, 3, 4]]
    assert [o["shape"] for o in theirs["outputs"]] == [[1], [1, 2]]
    assert [o["data"] for o in theirs["outputs"]] == [[9], [5, 6]]
    with pytest.raises(BadAnswer):
        split(parts, {"outputs": [{"name": "o", "shape": [2], "data": [1, 2]}]})


@pytest.mark.parametrize(
    ("protocol", "doc"),
    [
        ("v1", {"instances": [[1]], "parameters": {"k": 1}}),
        ("v1", {"instances": []}),
        ("v1", [1, 2]),
        ("v2", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1]}]}),
        ("v2", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                            "data": [[1, 2]]}]}),
        ("v2", {"id": "7", **v2("x", [[1.0]])}),
        ("v2", {"inputs": [v2("x", [[1.0]])["inputs"][0], v2("y", [[1.0], [2.0]])["inputs"][0]]}),
    ],
)  # fmt: skip
def test_only_plain_requests_merge(protocol: str, doc: Any) -> None:
    with pytest.raises(Unbatchable):
        part(protocol, doc)


def test_different_shapes_do_not_share_a_key() -> None:
    keys = {part("v2", v2("x", [[1.0, 2.0]])).key, part("v2", v2("x", [[1.0, 2.0, 3.0]])).key,
            part("v2", v2("y", [[1.0, 2.0]])).key}  # fmt: skip
    assert len(keys) == 3
    assert isinstance(part("v1", {"instances": [1]}), Part)
