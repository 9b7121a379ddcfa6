"""The spec fields of sleeping instances (`autoscaling.max_asleep`,
`keep_asleep_ms`): read from YAML's mapping, checked naming the field, and
refused for a runtime that does not serve an LLM; and the instance ids a
restarted Dispatch gives, past those recorded (a sleeping one among them)."""

from __future__ import annotations

import re

import pytest

from controlplane.runtime import servingruntime, validation
from controlplane.runtime import spec as specs
from controlplane.runtime.errors import InvalidArgument
from functions.dispatch.dispatcher import first_free_id
from galaxy.v1 import common_pb2


def _spec(autoscaling: dict) -> common_pb2.FunctionSpec:
    s = specs.from_dict({"name": "f", "runtime": "r", "autoscaling": autoscaling})
    validation.check_autoscaling(s.autoscaling)
    return s


def test_sleep_fields_are_kept() -> None:
    s = _spec({"max_asleep": 2, "keep_asleep_ms": 60_000})
    assert (s.autoscaling.max_asleep, s.autoscaling.keep_asleep_ms) == (2, 60_000)
    assert _spec({}).autoscaling.max_asleep == 0  # default: no instance sleeps


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"max_asleep": -1}, "autoscaling.max_asleep"),
        ({"max_asleep": "two"}, "autoscaling.max_asleep"),
        ({"max_asleep": validation.MAX_ASLEEP + 1}, "autoscaling.max_asleep"),
        ({"keep_asleep_ms": validation.IDLE_MS_MAX + 1}, "autoscaling.keep_asleep_ms"),
        ({"keep_asleep_s": 60}, "autoscaling.keep_asleep_s: unknown field"),
    ],
)
def test_bad_sleep_fields_are_refused_naming_the_field(doc: dict, field: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(field)):
        _spec(doc)


def test_only_an_llm_runtime_sleeps() -> None:
    rt = common_pb2.ServingRuntime(name="r", command=["server"])
    spec = common_pb2.FunctionSpec(name="f", runtime="r")
    spec.autoscaling.max_asleep = 1
    with pytest.raises(InvalidArgument, match=r"autoscaling\.max_asleep: runtime r is not an LLM"):
        servingruntime.resolve(spec, rt)
    rt.llm = True
    assert servingruntime.resolve(spec, rt).autoscaling.max_asleep == 1


def test_a_restarted_dispatch_names_new_instances_past_the_recorded_ones() -> None:
    # A start under a recorded (say sleeping) instance's id would join it.
    rec = [
        common_pb2.InstanceInfo(instance_id=i)
        for i in ("f-00001-dispatch-0-7", "f-00001-dispatch-0-2", "f-dispatch-1-40", "odd")
    ]
    assert first_free_id(rec, "dispatch-0") == 8
    assert first_free_id(rec, "dispatch-1") == 41
    assert first_free_id(rec, "dispatch-2") == 0
