"""The server is the guard: what the CLI refuses, the controller and Dispatch
refuse too, naming the field, with short messages, and nothing is stored."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import wrappers_pb2

from controlplane.runtime import rpc, validation
from galaxy.v1 import common_pb2, controller_pb2, dispatch_pb2
from tests.security.conftest import ThreadedCluster


def _spec(name: str = "fn", **kw: object) -> common_pb2.FunctionSpec:
    kw.setdefault("runtime", "sec")
    return common_pb2.FunctionSpec(name=name, **kw)  # type: ignore[arg-type]


def _delete(c: ThreadedCluster, name: str) -> None:
    c.ctl.DeleteFunction(controller_pb2.DeleteFunctionRequest(name=name), timeout=10)


def _deploy_error(c: ThreadedCluster, spec: common_pb2.FunctionSpec) -> grpc.RpcError:
    before = c.functions(), c.runtimes()
    with pytest.raises(grpc.RpcError) as e:
        c.ctl.DeployFunction(controller_pb2.DeployFunctionRequest(function=spec), timeout=10)
    assert (c.functions(), c.runtimes()) == before, "a refused deploy changed the stored state"
    return e.value


def test_negative_cpu_from_the_api_is_refused_naming_the_field(tcluster: ThreadedCluster) -> None:
    spec = _spec()
    # What a client in another language sends for cpu_millis: -250 (a varint
    # of -250 in field 1); Python's proto reads it as the uint32 4294967046.
    spec.resources.MergeFromString(wrappers_pb2.Int64Value(value=-250).SerializeToString())
    assert spec.resources.cpu_millis == 2**32 - 250
    err = _deploy_error(tcluster, spec)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("resources.cpu_millis: must be between 0 and")


def test_a_5_mib_env_value_is_refused_and_listing_still_works(tcluster: ThreadedCluster) -> None:
    spec = _spec(env={"BIG": "x" * (5 * 1024 * 1024)})
    err = _deploy_error(tcluster, spec)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("env.BIG: at most")
    assert len(err.details()) < 200
    # The client above has gRPC's default 4 MiB receive limit.
    assert all(f.name != "fn" for f in tcluster.functions())


def test_a_spec_over_the_total_size_is_refused(tcluster: ThreadedCluster) -> None:
    env = {f"K{i}": "v" * validation.MAX_ENV_VALUE_BYTES for i in range(8)}
    err = _deploy_error(tcluster, _spec(env=env))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("function: spec is")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(env={f"K{i}": "v" for i in range(validation.MAX_ENV_ENTRIES + 1)}), "env:"),
        (_spec(env={"A=B": "v"}), "env key 'A=B'"),
        (_spec(env={"K": "a\x00b"}), "env.K:"),
        (_spec(command=["python3", "x.py"]), "command: set by the runtime; name a runtime"),
        (_spec(workdir="/srv"), "workdir: set by the runtime"),
        (_spec(runtime=""), "runtime: required"),
        (_spec(runtime="Bad_Runtime"), "runtime: must be a DNS-1123 label"),
        (_spec(runtime="nope"), "runtime: no runtime 'nope' is registered"),
        (_spec(args=["x"] * (validation.MAX_COMMAND_ARGS + 1)), "args: at most"),
        (_spec(args=["--model-name=m"]), "args[0]: runtime sec admits only --flag"),
        (_spec(artifact="/srv/functions/a.py"), "artifact: runtime sec takes no artifact"),
        (_spec(readiness_path="healthz"), "readiness_path:"),
        (_spec(concurrency=10**6), "concurrency:"),
        (_spec(min_scale=5, max_scale=2), "min_scale:"),
        (_spec(startup_timeout_ms=10**9), "startup_timeout_ms:"),
        (_spec(name="Bad_Name"), "name:"),
    ],
)
def test_each_rule_names_its_field(
    tcluster: ThreadedCluster, spec: common_pb2.FunctionSpec, field: str
) -> None:
    err = _deploy_error(tcluster, spec)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(field), err.details()


def test_a_100_kib_name_gives_a_short_error_everywhere(tcluster: ThreadedCluster) -> None:
    name = "a" * (100 * 1024)
    calls = [
        lambda: tcluster.ctl.DeployFunction(
            controller_pb2.DeployFunctionRequest(function=_spec(name)), timeout=10
        ),
        lambda: tcluster.ctl.GetFunction(controller_pb2.GetFunctionRequest(name=name), timeout=10),
        lambda: tcluster.ctl.DeleteFunction(
            controller_pb2.DeleteFunctionRequest(name=name), timeout=10
        ),
        lambda: tcluster.dsp.Dispatch(dispatch_pb2.DispatchRequest(function=name), timeout=10),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(e.value.details().encode()) < 1024, e.value.details()[:200]
    # A name that passes the length rule but not the pattern: quoted, cut short.
    with pytest.raises(grpc.RpcError) as e:
        tcluster.ctl.GetFunction(controller_pb2.GetFunctionRequest(name="X" * 60), timeout=10)
    assert "'" + "X" * validation.QUOTE_CHARS + "'…" in e.value.details()
    assert "X" * (validation.QUOTE_CHARS + 1) not in e.value.details()


def test_the_function_count_is_bounded(tcluster: ThreadedCluster) -> None:
    store = tcluster.cluster.parts["controller"].component.servicer.functions
    saved = store.max_functions
    store.max_functions = len(tcluster.functions()) + 1
    try:
        tcluster.ctl.DeployFunction(
            controller_pb2.DeployFunctionRequest(function=_spec("count-a")), timeout=10
        )
        err = _deploy_error(tcluster, _spec("count-b"))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details().startswith("functions: ")
        # Redeploying an existing name is an update, not a new function.
        tcluster.ctl.DeployFunction(
            controller_pb2.DeployFunctionRequest(function=_spec("count-a", min_scale=0)),
            timeout=10,
        )
        _delete(tcluster, "count-a")
        tcluster.ctl.DeployFunction(
            controller_pb2.DeployFunctionRequest(function=_spec("count-b")), timeout=10
        )
    finally:
        store.max_functions = saved
        _delete(tcluster, "count-b")


def test_message_size_limits_are_explicit_on_both_sides() -> None:
    for options in (rpc._SERVER_OPTIONS, rpc._CHANNEL_OPTIONS):
        o = dict(options)
        assert o["grpc.max_receive_message_length"] == validation.MAX_MESSAGE_BYTES
        assert o["grpc.max_send_message_length"] == validation.MAX_MESSAGE_BYTES
    # The largest listing (every function at the size limit) fits, with room
    # for the rest of a cluster status.
    listing = validation.MAX_FUNCTIONS_DEFAULT * (validation.MAX_SPEC_BYTES + 16)
    assert listing < validation.MAX_MESSAGE_BYTES // 2
