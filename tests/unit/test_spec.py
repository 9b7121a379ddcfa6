"""Function spec parsing and validation: errors name the field."""

from pathlib import Path

import pytest

from controlplane.runtime import spec
from controlplane.runtime.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[2]

GOOD = {"name": "echo", "command": ["python3", "x.py"]}


def test_example_spec_loads_with_absolute_workdir():
    s = spec.load_file(REPO / "examples" / "echo.yaml")
    assert s.name == "echo" and s.workdir == str(REPO / "examples")
    assert s.concurrency == 4 and s.max_scale == 4 and s.readiness_path == "/healthz"


def test_defaults():
    s = spec.from_dict(GOOD)
    assert (s.concurrency, s.min_scale, s.max_scale) == (1, 0, 10)
    assert s.resources.cpu_millis == 100


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": None}, "name"),
        ({"command": "python3 x.py"}, "command"),
        ({"command": []}, "command"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": "4"}, "concurrency"),
        ({"resources": {"cpu_millis": -1}}, "resources.cpu_millis"),
        ({"resources": {"cpus": 1}}, "resources.cpus"),
        ({"min_scale": 5, "max_scale": 2}, "min_scale"),
        ({"readiness_path": "healthz"}, "readiness_path"),
        ({"replicas": 3}, "replicas"),
    ],
)
def test_invalid_specs_name_the_field(patch, field):
    with pytest.raises(InvalidArgument) as e:
        spec.from_dict({**GOOD, **patch})
    assert e.value.message.startswith(field), e.value.message


def test_not_a_mapping_and_bad_yaml(tmp_path):
    with pytest.raises(InvalidArgument, match="mapping"):
        spec.from_dict(["x"])
    f = tmp_path / "bad.yaml"
    f.write_text("name: [unclosed")
    with pytest.raises(InvalidArgument, match="not valid YAML"):
        spec.load_file(f)
    with pytest.raises(InvalidArgument, match="cannot read"):
        spec.load_file(tmp_path / "missing.yaml")


def test_with_defaults_fills_proto_zero_values():
    from galaxy.v1 import common_pb2

    s = spec.with_defaults(common_pb2.FunctionSpec(name="a", command=["x"]))
    assert s.concurrency == 1 and s.max_scale == 10 and s.startup_timeout_ms > 0


def test_with_defaults_fills_missing_resources():
    from galaxy.v1 import common_pb2

    s = spec.with_defaults(common_pb2.FunctionSpec(name="a", command=["x"]))
    assert s.HasField("resources") and s.resources.cpu_millis == spec.DEFAULT_CPU_MILLIS
