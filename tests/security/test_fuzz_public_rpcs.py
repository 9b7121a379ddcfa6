"""Property-based tests of the public RPCs (hypothesis): random and extreme
field values and random bytes. For every call: never INTERNAL or UNKNOWN,
the servers still answer, and a refused call leaves the stored functions
and runtimes exactly as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from controlplane.runtime import servingruntime, validation
from galaxy.v1 import common_pb2, controller_pb2, dispatch_pb2
from tests.security.conftest import RUNTIMES, ThreadedCluster

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
FIXED = tuple(rt.name for rt in RUNTIMES)
artifacts = st.one_of(
    texts,
    st.sampled_from(
        ["", "/srv/functions/a.py", "/srv/functions/../x.py", "/srv/functionsx/a.py", "/a.py"]
    ),
)
args = st.lists(
    st.one_of(texts, st.sampled_from(["--model-name", "--model-name=m", "--workers=2", "-x"])),
    max_size=6,
)


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": names,
    "namespace": names,
    "runtime": st.one_of(st.sampled_from(FIXED), names),
    "artifact": artifacts,
    "args": args,
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
        runtime=draw(st.sampled_from(FIXED)),
    )
    if spec.runtime == "strict":
        spec.artifact = "/srv/functions/main.py"
    field = draw(st.sampled_from([*FIELDS, *RESOURCES]))
    if field in RESOURCES:
        setattr(spec.resources, field, draw(u32))
    elif field == "env":
        spec.env.update(draw(envs))
    elif field in ("command", "args"):
        getattr(spec, field)[:] = draw(FIELDS[field])
    else:
        setattr(spec, field, draw(FIELDS[field]))
    return spec


@pytest.fixture(scope="module")
def fuzzed(tcluster: ThreadedCluster) -> Iterator[ThreadedCluster]:
    """The cluster with two functions stored, so "unchanged" means something."""
    for name in ("canary-one", "canary-two"):
        spec = common_pb2.FunctionSpec(name=name, runtime="sec")
        tcluster.ctl.DeployFunction(controller_pb2.DeployFunctionRequest(function=spec))
    yield tcluster
    for name in ("canary-one", "canary-two"):
        tcluster.ctl.DeleteFunction(controller_pb2.DeleteFunctionRequest(name=name))


def _tokens(c: ThreadedCluster) -> list[Any]:
    return list(c.ctl.ListTokens(controller_pb2.ListTokensRequest(), timeout=10).tokens)


def _call(c: ThreadedCluster, rpc: Callable[[], Any]) -> grpc.StatusCode:
    """Run rpc; check the status and that nothing changed unless it succeeded."""
    before = c.functions(), c.runtimes(), _tokens(c)
    try:
        rpc()
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        assert code not in BAD, f"{code}: {e.details()[:300]}"
        assert len(e.details().encode()) < 1024, "error message too long"
    event(f"status {code.name}")
    after = c.functions(), c.runtimes(), _tokens(c)  # the controller still answers
    if code != grpc.StatusCode.OK:
        assert after == before, "a refused call changed the stored functions, runtimes or tokens"
    return code


@pytest.mark.slow
@FUZZ
@given(spec=specs())
def test_deploy_function(fuzzed: ThreadedCluster, spec: common_pb2.FunctionSpec) -> None:
    req = controller_pb2.DeployFunctionRequest(function=spec)
    code = _call(fuzzed, lambda: fuzzed.ctl.DeployFunction(req, timeout=10))
    if code == grpc.StatusCode.OK:  # valid: it passed every rule; clean up
        rt = next(r for r in RUNTIMES if r.name == spec.runtime)
        servingruntime.resolve(spec, rt)
        if spec.name not in ("canary-one", "canary-two"):
            fuzzed.ctl.DeleteFunction(controller_pb2.DeleteFunctionRequest(name=spec.name))


@pytest.mark.slow
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


_seqs = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))
_stream_messages = st.lists(
    st.tuples(
        _seqs,
        st.one_of(st.none(), names),
        texts,
        u32,
        st.booleans(),
        st.lists(st.tuples(names, texts), max_size=2),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.slow
@FUZZ
@given(messages=_stream_messages)
def test_dispatch_stream(fuzzed: ThreadedCluster, messages: list[tuple[Any, ...]]) -> None:
    """Random messages on one DispatchStream: every reply and the stream's
    end carry a clear status, never INTERNAL or UNKNOWN or a long message."""
    msgs = []
    for seq, name, rid, timeout_ms, cancel, rels in messages:
        if name in ("canary-one", "canary-two"):
            name = "not-" + name  # a real cold start, not what this test is about
        m = dispatch_pb2.DispatchStreamRequest(seq=seq, timeout_ms=timeout_ms, cancel=cancel)
        if name is not None:
            m.request.function, m.request.request_id = name, rid
        m.releases.extend(dispatch_pb2.ReleaseRequest(function=f, lease_id=lid) for f, lid in rels)
        msgs.append(m)

    def call() -> None:
        for reply in fuzzed.dsp.DispatchStream(iter(msgs), timeout=10):
            assert reply.code not in (c.value[0] for c in BAD), reply.message[:300]
            assert len(reply.message.encode()) < 1024
            assert reply.seq == 0 or reply.code != 0  # no such function is deployed

    _call(fuzzed, call)


@FUZZ
@given(name=names, lease_id=texts)
def test_release(fuzzed: ThreadedCluster, name: str, lease_id: str) -> None:
    req = dispatch_pb2.ReleaseRequest(function=name, lease_id=lease_id)
    _call(fuzzed, lambda: fuzzed.dsp.Release(req, timeout=10))


RT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": names,
    "command": st.one_of(
        commands,
        st.lists(st.sampled_from(["python3", "{args}", "{artifact}", "x{args}", "-u"]), max_size=5),
    ),
    "description": texts,
    "workdir": st.one_of(st.just(""), st.just("/srv"), texts),
    "allowed_args": st.lists(st.one_of(texts, st.just("--ok")), max_size=3),
    "max_args": u32,
    "allowed_env": st.lists(texts, max_size=3),
    "readiness_path": st.one_of(st.just(""), st.just("/healthz"), texts),
    "startup_timeout_ms": u32,
    "concurrency": u32,
}


@st.composite
def runtimes(draw: Callable[..., Any]) -> common_pb2.ServingRuntime:
    """A valid runtime with one field random, or every field random."""
    rt = common_pb2.ServingRuntime(
        name=draw(st.from_regex(validation.NAME_RE, fullmatch=True)),
        command=["python3", "-u", "{artifact}", "{args}"],
        artifact=common_pb2.ServingRuntime.ArtifactRules(prefixes=["/srv"]),
    )
    chosen = list(RT_FIELDS) if draw(st.booleans()) else [draw(st.sampled_from(list(RT_FIELDS)))]
    for f in chosen:
        v = draw(RT_FIELDS[f])
        if isinstance(v, list):
            getattr(rt, f)[:] = v
        else:
            setattr(rt, f, v)
    if draw(st.booleans()):
        a = rt.artifact
        a.required = draw(st.booleans())
        a.prefixes[:] = draw(st.lists(st.one_of(texts, st.just("s3://b/")), max_size=3))
        a.suffixes[:] = draw(st.lists(texts, max_size=2))
        a.max_length = draw(u32)
    if rt.name in FIXED:
        rt.name = "x" + rt.name  # the fixed runtimes stay as they are
    return rt


@pytest.mark.slow
@FUZZ
@given(rt=runtimes())
def test_put_runtime(fuzzed: ThreadedCluster, rt: common_pb2.ServingRuntime) -> None:
    req = controller_pb2.PutRuntimeRequest(runtime=rt)
    code = _call(fuzzed, lambda: fuzzed.ctl.PutRuntime(req, timeout=10))
    if code == grpc.StatusCode.OK:  # valid: it passed every rule; clean up
        servingruntime.check_runtime(rt)
        fuzzed.ctl.DeleteRuntime(controller_pb2.DeleteRuntimeRequest(name=rt.name), timeout=10)


@pytest.mark.slow
@FUZZ
@given(
    name=texts,
    role=st.one_of(st.sampled_from(["admin", "developer", "invoker"]), texts),
    namespace=names,
)
def test_create_and_delete_token(
    fuzzed: ThreadedCluster, name: str, role: str, namespace: str
) -> None:
    req = controller_pb2.CreateTokenRequest(name=name, role=role, namespace=namespace)
    created: list[Any] = []
    code = _call(fuzzed, lambda: created.append(fuzzed.ctl.CreateToken(req, timeout=10)))
    if code == grpc.StatusCode.OK:  # valid: it passed every rule; clean up
        reply = created[0]
        assert reply.token.startswith(f"glx_{reply.info.id}_")
        assert reply.info.role == role and reply.token not in str(_tokens(fuzzed))
        fuzzed.ctl.DeleteToken(controller_pb2.DeleteTokenRequest(id=reply.info.id), timeout=10)
    delete = controller_pb2.DeleteTokenRequest(id=name)
    assert _call(fuzzed, lambda: fuzzed.ctl.DeleteToken(delete, timeout=10)) != grpc.StatusCode.OK


PUBLIC = [
    ("controller", "/galaxy.v1.Controller/DeployFunction"),
    ("controller", "/galaxy.v1.Controller/GetFunction"),
    ("controller", "/galaxy.v1.Controller/ListFunctions"),
    ("controller", "/galaxy.v1.Controller/DeleteFunction"),
    ("controller", "/galaxy.v1.Controller/GetClusterStatus"),
    ("controller", "/galaxy.v1.Controller/GetMembership"),
    ("controller", "/galaxy.v1.Controller/PutRuntime"),
    ("controller", "/galaxy.v1.Controller/GetRuntime"),
    ("controller", "/galaxy.v1.Controller/ListRuntimes"),
    ("controller", "/galaxy.v1.Controller/DeleteRuntime"),
    ("controller", "/galaxy.v1.Controller/CreateToken"),
    ("controller", "/galaxy.v1.Controller/ListTokens"),
    ("controller", "/galaxy.v1.Controller/DeleteToken"),
    ("controller", "/galaxy.v1.Controller/ListRevisions"),
    ("controller", "/galaxy.v1.Controller/SetTraffic"),
    ("controller", "/galaxy.v1.Controller/ApplyGraph"),
    ("controller", "/galaxy.v1.Controller/GetGraph"),
    ("controller", "/galaxy.v1.Controller/ListGraphs"),
    ("controller", "/galaxy.v1.Controller/DeleteGraph"),
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
    mutating = (
        "DeployFunction",
        "DeleteFunction",
        "PutRuntime",
        "DeleteRuntime",
        "CreateToken",
        "DeleteToken",
        "SetTraffic",
        "ApplyGraph",
        "DeleteGraph",
    )
    if code == grpc.StatusCode.OK and method.endswith(mutating):
        pytest.fail(f"random bytes {data[:40]!r} were a valid {method}")
