"""`model:` in function specs: parsed from YAML, checked with errors that name
the field, and tied to the runtime's {model} placeholder."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.runtime import models, servingruntime, spec
from controlplane.runtime.errors import InvalidArgument
from galaxy.v1 import common_pb2

SHA = "a" * 64


def _spec(model: object) -> dict:
    return {"name": "m", "runtime": "python", "artifact": "/srv/x.py", "model": model}


def test_a_model_is_parsed_and_a_relative_path_is_taken_from_the_spec(tmp_path: Path) -> None:
    s = spec.from_dict(
        _spec({"uri": "models/iris.joblib", "format": "sklearn", "sha256": SHA,
               "size_bytes": 10, "warm": {"nodes": 2}}),
        base_dir=tmp_path,
    )  # fmt: skip
    assert s.model.uri == str(tmp_path / "models" / "iris.joblib")
    assert (s.model.format, s.model.sha256, s.model.size_bytes, s.model.warm_nodes) == (
        "sklearn", SHA, 10, 2,
    )  # fmt: skip
    assert models.digest(s.model) == SHA
    http = spec.from_dict(_spec({"uri": "http://store:8000/a.gguf"}), None)
    assert models.digest(http.model) != SHA and len(models.digest(http.model)) == 64


@pytest.mark.parametrize(
    "model, field",
    [
        ("x", "model:"),
        ({}, "model.uri"),
        ({"uri": "s3://bucket"}, "model.uri"),
        ({"uri": "ftp://h/x"}, "model.uri"),
        ({"uri": "http:///nohost"}, "model.uri"),
        ({"uri": "/m", "sha256": "ABC"}, "model.sha256"),
        ({"uri": "/m", "format": "Not Valid"}, "model.format"),
        ({"uri": "/m", "size_bytes": -1}, "model.size_bytes"),
        ({"uri": "/m", "size_bytes": "1"}, "model.size_bytes"),
        ({"uri": "/m", "warm": {"nodes": -1}}, "model.warm.nodes"),
        ({"uri": "/m", "warm": {"replicas": 1}}, "model.warm"),
        ({"uri": "/m", "colour": "red"}, "model.colour"),
        ({"uri": "/m\n/etc/passwd"}, "model.uri"),
    ],
)
def test_bad_models_are_refused_naming_the_field(model, field) -> None:
    with pytest.raises(InvalidArgument) as e:
        spec.from_dict(_spec(model), None)
    assert e.value.message.startswith(field), e.value.message
    assert "/etc/passwd" not in e.value.message


def _runtime(command: list[str]) -> common_pb2.ServingRuntime:
    rt = common_pb2.ServingRuntime(name="python", command=command)
    rt.artifact.prefixes.append("/srv")
    return rt


def test_a_runtime_that_takes_a_model_needs_one_and_keeps_the_placeholder() -> None:
    rt = _runtime(["python3", "{artifact}", "--model={model}"])
    bare = spec.from_dict({"name": "m", "runtime": "python", "artifact": "/srv/x.py"}, None)
    with pytest.raises(InvalidArgument, match=r"^model: runtime python hands a model"):
        servingruntime.resolve(bare, rt)
    resolved = servingruntime.resolve(spec.from_dict(_spec({"uri": "/m/x.bin"}), None), rt)
    assert resolved.command[-1] == "--model={model}"  # the node agent fills it in
    assert models.command_with_model(list(resolved.command), "/cache/abc") == [
        "python3", "/srv/x.py", "--model=/cache/abc",
    ]  # fmt: skip
