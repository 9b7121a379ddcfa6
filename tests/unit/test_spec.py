"""Function spec parsing and validation: errors name the field."""

from pathlib import Path

import pytest

from controlplane.runtime import servingruntime, spec
from controlplane.runtime.errors import InvalidArgument
from galaxy.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]

GOOD = {"name": "echo", "runtime": "python", "artifact": "/srv/x.py"}


def test_example_spec_loads_with_absolute_artifact():
    s = spec.load_file(REPO / "examples" / "echo.yaml")
    assert s.name == "echo" and s.runtime == "python"
    assert s.artifact == str(REPO / "examples" / "echo_server.py")
    assert not s.command and not s.workdir  # the runtime's, on the controller
    assert s.concurrency == 4 and s.max_scale == 4 and s.readiness_path == "/healthz"


def test_defaults_are_left_to_the_runtime_then_the_cluster():
    s = spec.from_dict(GOOD)
    # 0/unset: the runtime's defaults apply on the controller, then with_defaults.
    assert (s.concurrency, s.min_scale, s.max_scale, s.startup_timeout_ms) == (0, 0, 10, 0)
    assert not s.HasField("resources")
    # A resources block is the whole request: keys left out get the cluster's.
    s = spec.from_dict({**GOOD, "resources": {"gpus": 1}})
    assert (s.resources.cpu_millis, s.resources.memory_mib) == (100, 128)
    # The disk limit left out is the node agent's default (0 here).
    assert s.resources.disk_mib == 0
    assert spec.from_dict({**GOOD, "resources": {"disk_mib": 64}}).resources.disk_mib == 64


def test_a_relative_artifact_is_made_absolute_but_not_a_uri(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_text("name: f\nruntime: python\nartifact: app/main.py\nargs: [--x=1]\n")
    s = spec.load_file(f)
    assert s.artifact == str(tmp_path / "app" / "main.py") and list(s.args) == ["--x=1"]
    f.write_text("name: f\nruntime: models\nartifact: s3://bucket/m\n")
    assert spec.load_file(f).artifact == "s3://bucket/m"


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": None}, "name"),
        ({"command": ["python3", "x.py"]}, "command: set by the runtime"),
        ({"workdir": "."}, "workdir: set by the runtime"),
        ({"runtime": None}, "runtime: required"),
        ({"runtime": "Py"}, "runtime:"),
        ({"artifact": 3}, "artifact:"),
        ({"args": "--x"}, "args:"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": "4"}, "concurrency"),
        ({"resources": {"cpu_millis": -1}}, "resources.cpu_millis"),
        ({"resources": {"disk_mib": -1}}, "resources.disk_mib"),
        ({"resources": {"disk_mib": 1 << 40}}, "resources.disk_mib"),
        ({"resources": {"cpus": 1}}, "resources.cpus"),
        ({"min_scale": 5, "max_scale": 2}, "min_scale"),
        ({"readiness_path": "healthz"}, "readiness_path"),
        ({"replicas": 3}, "replicas"),
        ({"egress": "yes"}, "egress: must be true or false"),
        ({"request_timeout_ms": -5}, "request_timeout_ms"),
        ({"request_timeout_ms": 10**9}, "request_timeout_ms"),
        ({"autoscaling": [1]}, "autoscaling"),
        ({"autoscaling": {"window": 1}}, "autoscaling.window"),
        ({"autoscaling": {"target_utilization": 1.5}}, "autoscaling.target_utilization"),
        ({"autoscaling": {"target_utilization": "high"}}, "autoscaling.target_utilization"),
        ({"autoscaling": {"stable_window_ms": 1000}}, "autoscaling.stable_window_ms"),
        ({"autoscaling": {"panic_window_percent": 0.5}}, "autoscaling.panic_window_percent"),
        ({"autoscaling": {"keepalive": "forever"}}, "autoscaling.keepalive"),
        ({"autoscaling": {"keepalive": "hybrid", "keepalive_ms": 9}}, "autoscaling.keepalive_ms"),
    ],
)
def test_invalid_specs_name_the_field(patch, field):
    with pytest.raises(InvalidArgument) as e:
        spec.from_dict({**GOOD, **patch})
    assert e.value.message.startswith(field), e.value.message


def test_request_timeout_and_autoscaling_from_yaml():
    s = spec.from_dict(
        {
            **GOOD,
            "request_timeout_ms": 60_000,
            "autoscaling": {
                "target_utilization": 0.7,
                "stable_window_ms": 6000,
                "keepalive": "hybrid",
            },
        }
    )
    assert s.request_timeout_ms == 60_000
    a = s.autoscaling
    assert (a.target_utilization, a.stable_window_ms, a.keepalive) == (0.7, 6000, "hybrid")
    assert spec.from_dict(GOOD).request_timeout_ms == 0  # the cluster default


def test_api_specs_get_the_same_autoscaling_rules():
    # Straight from the API (no YAML): NaN and out-of-range values refused.
    for bad, field in [
        (common_pb2.AutoscalingSpec(target_utilization=float("nan")), "target_utilization"),
        (common_pb2.AutoscalingSpec(stable_window_ms=4_000_000), "stable_window_ms"),
    ]:
        s = spec.from_dict(GOOD)
        s.autoscaling.CopyFrom(bad)
        with pytest.raises(InvalidArgument) as e:
            servingruntime.check_request(s)  # what DeployFunction applies first
        assert e.value.message.startswith("autoscaling." + field), e.value.message


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


def test_namespace_from_yaml(tmp_path):
    from controlplane.runtime import spec as specs

    path = tmp_path / "f.yaml"
    path.write_text("name: f\nnamespace: team-a\nruntime: python\nartifact: /x/f.py\n")
    assert specs.load_file(path).namespace == "team-a"
    path.write_text("name: f\nnamespace: [x]\nruntime: python\n")
    with pytest.raises(InvalidArgument, match=r"^namespace: must be a string"):
        specs.load_file(path)


def test_egress_from_yaml_and_off_by_default():
    assert spec.from_dict(GOOD).egress is False
    assert spec.from_dict({**GOOD, "egress": True}).egress is True
