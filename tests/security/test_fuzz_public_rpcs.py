"""Property-based tests of the public RPCs (hypothesis): random and extreme
field values and random bytes. For every call: never INTERNAL or UNKNOWN,
the servers still answer, and a refused call leaves the stored functions
exactly as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from controlplane.runtime import validation
from galaxy.v1 import common_pb2, controller_pb2, dispatch_pb2
from tests.security.conftest import ThreadedCluster

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples on every run: no flaky CI
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
U32 = 2**32 - 1

# Text a proto string can hold (no lone surrogates), sometimes very long.
_chars = st.characters(exclude_categories=("Cs",))
_short_text = st.text(_chars, max_size=40)
_long_text = st.tuples(st.text(_chars, min_size=1, max_size=3), st.integers(1, 200_000)).map(
    lambda t: t[0] * t[1]
)
texts = st.one_of(_short_text, _short_text, _long_text)
names = st.one_of(
    texts,
    st.from_regex(validation.NAME_RE, fullmatch=True),
    st.sampled_from(["", "-", "a-", "A", "a" * 63, "a" * 64, "a\x00b", "é"]),
)
u32 = st.one_of(
    st.integers(0, 1000), st.integers(0, U32), st.sampled_from([0, 1, 2**31, 2**31 - 1, U32])
)
# Valid min_scale > 0 would start instances; the interest here is refusals.
min_scales = st.one_of(st.just(0), st.integers(validation.SCALE_MAX + 1, U32))
envs = st.dictionaries(texts, texts, max_size=6) | st.lists(
    st.integers(0, 10**6), unique=True, min_size=120, max_size=140
).map(lambda ks: {f"K{k}": "v" for k in ks})
commands = st.lists(texts, max_size=4) | st.lists(st.just("x"), min_size=250, max_size=300)


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": names,
    "command": commands,
    "workdir": st.one_of(st.just(""), st.just("/tmp"), texts),
    "env": envs,
    "concurrency": u32,
    "min_scale": min_scales,
    "max_scale": u32,
    "readiness_path": st.one_of(st.just(""), st.just("/healthz"), texts),
    "startup_timeout_ms": u32,
    "version": st.integers(0, 2**64 - 1),
}
RESOURCES = ("cpu_millis", "memory_mib", "gpus")


@st.composite
def specs(draw: Callable[..., Any]) -> common_pb2.FunctionSpec:
    """Either every field random, or a valid spec with one field random (so
    each rule is reached on its own, and some deploys succeed)."""
    if draw(st.booleans()):
        spec = common_pb2.FunctionSpec(**{f: draw(s) for f, s in FIELDS.items()})
        if draw(st.booleans()):
            for r in RESOURCES:
                setattr(spec.resources, r, draw(u32))
        return spec
    spec = common_pb2.FunctionSpec(
        name=draw(st.from_regex(validation.NAME_RE, fullmatch=True)),
        command=["python3", "-c", "pass"],
    )
    field = draw(st.sampled_from([*FIELDS, *RESOURCES]))
    if field in RESOURCES:
        setattr(spec.resources, field, draw(u32))
    elif field == "env":
        spec.env.update(draw(envs))
    elif field == "command":
        spec.command[:] = draw(commands)
    else:
        setattr(spec, field, draw(FIELDS[field]))
    return spec


@pytest.fixture(scope="module")
def fuzzed(tcluster: ThreadedCluster) -> Iterator[ThreadedCluster]:
    """The cluster with two functions stored, so "unchanged" means something."""
    for name in ("canary-one", "canary-two"):
        spec = common_pb2.FunctionSpec(name=name, command=["python3", "-c", "pass"])
        tcluster.ctl.DeployFunction(controller_pb2.DeployFunctionRequest(function=spec))
    yield tcluster
    for name in ("canary-one", "canary-two"):
        tcluster.ctl.DeleteFunction(controller_pb2.DeleteFunctionRequest(name=name))


def _call(c: ThreadedCluster, rpc: Callable[[], Any]) -> grpc.StatusCode:
    """Run rpc; check the status and that nothing changed unless it succeeded."""
    before = c.functions()
    try:
        rpc()
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        assert code not in BAD, f"{code}: {e.details()[:300]}"
        assert len(e.details().encode()) < 1024, "error message too long"
    event(f"status {code.name}")
    after = c.functions()  # the controller still answers
    if code != grpc.StatusCode.OK:
        assert after == before, "a refused call changed the stored functions"
    return code


@FUZZ
@given(spec=specs())
def test_deploy_function(fuzzed: ThreadedCluster, spec: common_pb2.FunctionSpec) -> None:
    req = controller_pb2.DeployFunctionRequest(function=spec)
    code = _call(fuzzed, lambda: fuzzed.ctl.DeployFunction(req, timeout=10))
    if code == grpc.StatusCode.OK:  # valid: it passed every rule; clean up
        validation.check_spec(spec)
        if spec.name not in ("canary-one", "canary-two"):
            fuzzed.ctl.DeleteFunction(controller_pb2.DeleteFunctionRequest(name=spec.name))


@FUZZ
@given(name=names)
def test_get_and_delete_function(fuzzed: ThreadedCluster, name: str) -> None:
    get = controller_pb2.GetFunctionRequest(name=name)
    _call(fuzzed, lambda: fuzzed.ctl.GetFunction(get, timeout=10))
    if name not in ("canary-one", "canary-two"):
        delete = controller_pb2.DeleteFunctionRequest(name=name)
        assert _call(fuzzed, lambda: fuzzed.ctl.DeleteFunction(delete, timeout=10)) != (
            grpc.StatusCode.OK
        )


@FUZZ
@given(
    name=names,
    request_id=texts,
    releases=st.lists(st.tuples(names, texts), max_size=3),
)
def test_dispatch(
    fuzzed: ThreadedCluster, name: str, request_id: str, releases: list[tuple[str, str]]
) -> None:
    if name in ("canary-one", "canary-two"):
        return  # a real cold start, not what this test is about
    req = dispatch_pb2.DispatchRequest(
        function=name,
        request_id=request_id,
        releases=[dispatch_pb2.ReleaseRequest(function=f, lease_id=lid) for f, lid in releases],
    )
    code = _call(fuzzed, lambda: fuzzed.dsp.Dispatch(req, timeout=10))
    assert code != grpc.StatusCode.OK  # no such function


@FUZZ
@given(name=names, lease_id=texts)
def test_release(fuzzed: ThreadedCluster, name: str, lease_id: str) -> None:
    req = dispatch_pb2.ReleaseRequest(function=name, lease_id=lease_id)
    _call(fuzzed, lambda: fuzzed.dsp.Release(req, timeout=10))


PUBLIC = [
    ("controller", "/galaxy.v1.Controller/DeployFunction"),
    ("controller", "/galaxy.v1.Controller/GetFunction"),
    ("controller", "/galaxy.v1.Controller/ListFunctions"),
    ("controller", "/galaxy.v1.Controller/DeleteFunction"),
    ("controller", "/galaxy.v1.Controller/GetClusterStatus"),
    ("controller", "/galaxy.v1.Controller/GetMembership"),
    ("dispatch", "/galaxy.v1.Dispatch/Dispatch"),
    ("dispatch", "/galaxy.v1.Dispatch/Release"),
    ("dispatch", "/galaxy.v1.Dispatch/ListInstances"),
]


@FUZZ
@given(target=st.sampled_from(PUBLIC), data=st.binary(max_size=512))
def test_random_bytes(fuzzed: ThreadedCluster, target: tuple[str, str], data: bytes) -> None:
    server, method = target
    address = fuzzed.controller if server == "controller" else fuzzed.dispatch

    def call() -> None:
        answer = fuzzed.raw(address, method, data)
        if isinstance(answer, grpc.RpcError):
            raise answer

    code = _call(fuzzed, call)
    if code == grpc.StatusCode.OK and method.endswith(("DeployFunction", "DeleteFunction")):
        pytest.fail(f"random bytes {data[:40]!r} were a valid {method}")
