"""The ``batching`` field of a function spec: validated, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.runtime import spec as specs
from controlplane.runtime import validation
from controlplane.runtime.errors import InvalidArgument
from galaxy.v1 import common_pb2


def doc(batching: Any) -> dict[str, Any]:
    return {"name": "iris", "runtime": "python", "artifact": "/srv/a.py", "batching": batching}


def test_batching_is_read() -> None:
    s = specs.from_dict(doc({"max_batch_size": 32, "max_latency_ms": 5}))
    assert (s.batching.max_batch_size, s.batching.max_latency_ms) == (32, 5)
    assert not specs.from_dict({k: v for k, v in doc(None).items() if k != "batching"}).HasField(
        "batching"
    )


@pytest.mark.parametrize(
    ("batching", "field"),
    [
        ([1, 2], "batching: must be a mapping"),
        ({"max_batch_size": 8}, "batching.max_latency_ms: required"),
        ({"max_latency_ms": 8}, "batching.max_batch_size: required"),
        ({"max_batch_size": 1, "max_latency_ms": 5}, "batching.max_batch_size: must be between"),
        ({"max_batch_size": 8, "max_latency_ms": 0}, "batching.max_latency_ms: must be between"),
        ({"max_batch_size": 8, "max_latency_ms": "5"}, "batching.max_latency_ms: must be an int"),
        ({"max_batch_size": 8, "max_latency_ms": 5, "timeout": 1}, "batching.timeout: unknown"),
    ],
)
def test_bad_batching_names_the_field(batching: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        specs.from_dict(doc(batching))
    assert field in str(e.value)


def test_api_specs_are_checked_too() -> None:
    s = common_pb2.FunctionSpec(name="iris", command=["python3"], workdir="/srv")
    s.batching.max_batch_size = 100_000
    s.batching.max_latency_ms = 5
    with pytest.raises(InvalidArgument, match=r"batching\.max_batch_size"):
        validation.check_spec(s)
