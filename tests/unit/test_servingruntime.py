"""Serving runtime rules and resolution (pure): placeholders, what a spec may
set, defaults, and errors that name the field and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.runtime import runtimefiles, servingruntime
from controlplane.runtime.errors import InvalidArgument
from galaxy.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]
Rules = common_pb2.ServingRuntime.ArtifactRules


def _rt(**kw: object) -> common_pb2.ServingRuntime:
    base: dict[str, object] = {
        "name": "py",
        "command": ["python3", "-u", "{artifact}", "{args}"],
        "artifact": Rules(required=True, prefixes=["/srv/fn", "s3://models/"], suffixes=[".py"]),
        "allowed_args": ["--model-name", "--workers"],
        "max_args": 3,
        "allowed_env": ["APP_*", "LOG_LEVEL"],
    }
    base.update(kw)
    return common_pb2.ServingRuntime(**base)  # type: ignore[arg-type]


def _spec(**kw: object) -> common_pb2.FunctionSpec:
    base: dict[str, object] = {"name": "f", "runtime": "py", "artifact": "/srv/fn/app.py"}
    base.update(kw)
    return common_pb2.FunctionSpec(**base)  # type: ignore[arg-type]


def test_resolve_expands_the_placeholders_and_keeps_the_rest() -> None:
    out = servingruntime.resolve(
        _spec(args=["--model-name=m", "--workers"], env={"APP_X": "1", "LOG_LEVEL": "d"}),
        _rt(workdir="/srv"),
    )
    assert list(out.command) == ["python3", "-u", "/srv/fn/app.py", "--model-name=m", "--workers"]
    assert out.workdir == "/srv" and out.runtime == "py" and dict(out.env)["APP_X"] == "1"


def test_artifact_inside_an_element_and_an_optional_one_left_out() -> None:
    rt = _rt(
        command=["server", "--model={artifact}", "{artifact}"],
        artifact=Rules(prefixes=["s3://models/"]),
        allowed_args=[],
    )
    assert list(servingruntime.resolve(_spec(artifact="s3://models/m"), rt).command) == [
        "server",
        "--model=s3://models/m",
        "s3://models/m",
    ]
    # No artifact: the whole-element placeholder is dropped, not left empty.
    assert list(servingruntime.resolve(_spec(artifact=""), rt).command) == ["server", "--model="]


def test_artifact_text_is_not_expanded_again() -> None:
    out = servingruntime.resolve(_spec(artifact="/srv/fn/{args}.py"), _rt())
    assert list(out.command)[2] == "/srv/fn/{args}.py"


def test_defaults_come_from_the_runtime_only_where_the_spec_left_zero() -> None:
    rt = _rt(
        resources=common_pb2.Resources(cpu_millis=250, memory_mib=64, disk_mib=256),
        concurrency=4,
        readiness_path="/healthz",
        startup_timeout_ms=9000,
    )
    out = servingruntime.resolve(_spec(resources=common_pb2.Resources(cpu_millis=500)), rt)
    assert (out.resources.cpu_millis, out.resources.memory_mib) == (500, 64)
    assert out.resources.disk_mib == 256
    assert (out.concurrency, out.readiness_path, out.startup_timeout_ms) == (4, "/healthz", 9000)
    out = servingruntime.resolve(_spec(concurrency=2, readiness_path="/ready"), rt)
    assert (out.concurrency, out.readiness_path) == (2, "/ready")
    # A runtime without resources leaves them unset: the cluster's defaults apply.
    assert not servingruntime.resolve(_spec(), _rt()).HasField("resources")


@pytest.mark.parametrize(
    ("spec", "start"),
    [
        (_spec(command=["sh", "-c", "id"]), "command: set by the runtime; name a runtime instead"),
        (_spec(workdir="/tmp"), "workdir: set by the runtime"),
        (_spec(runtime=""), "runtime: required"),
        (_spec(runtime="other"), "runtime: the spec names 'other'"),
        (_spec(artifact=""), "artifact: required by runtime py"),
        (_spec(artifact="/srv/fnx/app.py"), "artifact: runtime py admits only artifacts under"),
        (_spec(artifact="/srv/fn/../etc/x.py"), "artifact: must not contain a '..' component"),
        (_spec(artifact="/srv/fn/app.sh"), "artifact: runtime py admits only artifacts ending"),
        (_spec(artifact="/srv/fn/a\nb.py"), "artifact: must be printable"),
        (_spec(args=["--port=1"]), "args[0]: runtime py admits only --flag or --flag=value"),
        (_spec(args=["positional"]), "args[0]:"),
        (_spec(args=["--workers"] * 4), "args: runtime py admits at most 3"),
        (_spec(env={"PYTHONPATH": "/x"}), "env key PYTHONPATH: runtime py does not admit it"),
        (_spec(env={"LD_PRELOAD": "/x.so"}), "env key LD_PRELOAD:"),
    ],
)
def test_refusals_name_the_field_and_the_rule(spec: common_pb2.FunctionSpec, start: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        servingruntime.resolve(spec, _rt())
    assert e.value.message.startswith(start), e.value.message
    assert len(e.value.message) < 300


def test_errors_quote_only_a_short_prefix_of_the_input() -> None:
    with pytest.raises(InvalidArgument) as e:
        servingruntime.resolve(_spec(args=["--x=" + "A" * 10_000]), _rt())
    assert "A" * 40 not in e.value.message and "…" in e.value.message


def test_an_artifact_with_no_placeholder_and_a_max_length() -> None:
    with pytest.raises(InvalidArgument, match=r"^artifact: runtime py takes no artifact"):
        servingruntime.resolve(_spec(), _rt(command=["srv"], artifact=Rules(), allowed_args=[]))
    with pytest.raises(InvalidArgument, match=r"^artifact: at most 12 bytes"):
        servingruntime.resolve(_spec(), _rt(artifact=Rules(prefixes=["/srv"], max_length=12)))


def test_prefixes_match_whole_path_components_and_uri_text() -> None:
    ok = servingruntime._prefix_ok
    assert ok("/srv/fn/a.py", "/srv/fn") and ok("/srv/fn", "/srv/fn")
    assert not ok("/srv/fnx/a.py", "/srv/fn")
    assert ok("/srv/fn/a.py", "/srv/") and ok("s3://models/m", "s3://models/")
    assert not ok("s3://modelsx/m", "s3://models/")


def test_env_patterns() -> None:
    allowed = ["APP_*", "LOG_LEVEL"]
    assert servingruntime.env_allowed("APP_MODE", allowed)
    assert servingruntime.env_allowed("LOG_LEVEL", allowed)
    assert not servingruntime.env_allowed("LOG_LEVELS", allowed)
    assert servingruntime.env_allowed("ANY", ["*"])
    assert not servingruntime.env_allowed("ANY", [])


@pytest.mark.parametrize(
    ("rt", "start"),
    [
        (_rt(name="Py"), "name:"),
        (_rt(command=[]), "command: required"),
        (_rt(command=["{artifact}", "x"]), "command[0]: must be the program"),
        (_rt(command=["{args}"]), "command[0]: must be the program"),
        (_rt(command=["p", "x{args}"]), "command[1]: {args} must be a whole element"),
        (_rt(command=["p", "{args}", "{args}"]), "command: {args} may appear once"),
        (_rt(artifact=Rules()), "artifact.prefixes: required when the command has {artifact}"),
        (_rt(artifact=Rules(prefixes=["srv"])), "artifact.prefixes[0]: must be an absolute path"),
        (_rt(artifact=Rules(prefixes=["/srv/../etc"])), "artifact.prefixes[0]: must not"),
        (_rt(artifact=Rules(prefixes=["/s"], suffixes=[""])), "artifact.suffixes[0]:"),
        (_rt(command=["p"], artifact=Rules(required=True)), "artifact.required:"),
        (_rt(allowed_args=["-x"]), "allowed_args[0]: must be a flag"),
        (_rt(command=["p", "{artifact}"]), "allowed_args: the command has no {args}"),
        (_rt(allowed_env=["A=B"]), "allowed_env[0]:"),
        (_rt(workdir="rel"), "workdir: must be an absolute path"),
        (_rt(readiness_path="healthz"), "readiness_path:"),
        (_rt(concurrency=10**6), "concurrency:"),
        (_rt(max_args=10**6), "max_args:"),
    ],
)
def test_runtime_rules_name_the_field(rt: common_pb2.ServingRuntime, start: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        servingruntime.check_runtime(rt)
    assert e.value.message.startswith(start), e.value.message


def test_the_examples_runtime_file_loads_and_runs_the_examples() -> None:
    rt = runtimefiles.load_file(REPO / "examples" / "runtimes" / "python.yaml")
    assert rt.name == "python" and list(rt.artifact.prefixes) == [str(REPO / "examples")]
    from controlplane.runtime import spec

    for example in ("echo", "stream"):
        s = spec.load_file(REPO / "examples" / f"{example}.yaml")
        out = servingruntime.resolve(s, rt)
        assert list(out.command) == [
            "python3",
            "-u",
            str(REPO / "examples" / f"{example}_server.py"),
        ]


def test_runtime_files_name_the_file_and_the_field(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("name: r\ncommand: [p, '{artifact}']\nartifact: {prefixes: [models]}\n")
    # A relative prefix is relative to the file: allowed, made absolute.
    assert list(runtimefiles.load_file(f).artifact.prefixes) == [str(tmp_path / "models")]
    f.write_text("name: r\ncommand: [p]\nallowed_args: [--x]\n")
    with pytest.raises(InvalidArgument, match=r"^r.yaml: allowed_args: the command has no"):
        runtimefiles.load_file(f)
    f.write_text("name: r\ncommand: [p]\nimage: x\n")
    with pytest.raises(InvalidArgument, match=r"^r.yaml: image: unknown field"):
        runtimefiles.load_file(f)
