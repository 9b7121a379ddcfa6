"""Inference graphs in the state store, on both backends (memory and a real
etcd): what is applied is read back with its version, an unchanged apply
writes nothing, bad documents are refused naming the field and leave
nothing stored, and the bounds (graphs per namespace, document size) hold.
Namespace rules through the controller's graph API with the principal the
access interceptor would set (tokens end to end: tests/models)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from controlplane.controller import graphs_store
from controlplane.controller.graphs_api import GraphsApi
from controlplane.controller.graphs_store import PREFIX, GraphStore, check_document
from controlplane.runtime import access, authn
from controlplane.runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from galaxy.v1 import controller_pb2
from statestore import StateStore
from tests.controller import test_runtimes_store

#: The state store on both backends: memory and a real etcd.
store = test_runtimes_store.store


def _doc(name: str, namespace: str = "", fn: str = "echo") -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "nodes": {"root": {
        "router": "Sequence", "steps": [{"name": "one", "function": fn}]}}}  # fmt: skip
    if namespace:
        d["namespace"] = namespace
    return d


def _js(doc: dict[str, Any]) -> str:
    return json.dumps(doc)


@pytest.fixture
async def names(store: StateStore) -> AsyncIterator[list[str]]:
    """Unique graph names; their keys are deleted afterwards (a shared etcd)."""
    made: list[str] = []
    yield made
    await store.delete_many([PREFIX + n for n in made])


def _name(names: list[str], prefix: str = "g") -> str:
    names.append(f"{prefix}-{uuid.uuid4().hex[:8]}")
    return names[-1]


async def test_apply_get_list_delete(store: StateStore, names: list[str]) -> None:
    graphs = GraphStore(store)
    a, b = _name(names, "a"), _name(names, "b")
    first = await graphs.put(check_document(_js(_doc(a)), "team-a"))
    assert first.version > 0 and first.namespace == "team-a"
    kv = await store.get(PREFIX + a)
    assert kv is not None and controller_pb2.GraphSpec.FromString(kv.value).name == a
    # The stored document is the checked one, its namespace filled in.
    assert json.loads((await graphs.get(a)).document_json)["namespace"] == "team-a"
    again = await graphs.put(check_document(_js(_doc(a)), "team-a"))
    assert again.version == first.version  # unchanged: nothing written
    changed = await graphs.put(check_document(_js(_doc(a, fn="other")), "team-a"))
    assert changed.version > first.version
    await graphs.put(check_document(_js(_doc(b, "team-b")), "team-a"))
    listed = [(g.name, g.namespace) for g in await graphs.list() if g.name in (a, b)]
    assert listed == [(a, "team-a"), (b, "team-b")]
    await graphs.delete(a)
    with pytest.raises(NotFound, match=f"graph '{a}' not found"):
        await graphs.get(a)
    with pytest.raises(NotFound):
        await graphs.delete(a)
    assert await graphs.find(a) is None


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("", "document_json: required"),
        ("{nope", "document_json: not JSON"),
        (_js({"nodes": {}}), "name: required"),
        (_js({**_doc("x"), "namespace": 7}), "namespace: a string"),
        (_js({**_doc("x"), "namespace": "Bad_NS"}), "namespace:"),
        (_js({**_doc("x"), "extra": 1}), "extra"),
        (_js({"name": "x", "nodes": {"root": {"router": "Loop", "steps": []}}}),
         "nodes.root.router"),
        (_js({"name": "x", "nodes": {"other": _doc("x")["nodes"]["root"]}}), "nodes.root"),
    ],
)  # fmt: skip
async def test_a_bad_document_is_refused_naming_the_field(
    store: StateStore, document: str, field: str
) -> None:
    graphs = GraphStore(store)
    before = await graphs.list()
    with pytest.raises(InvalidArgument) as e:
        await graphs.put(check_document(document, "team-a"))
    assert e.value.message.startswith(field) or field in e.value.message
    assert len(e.value.message) < 300, "the refusal echoes the input"
    assert await graphs.list() == before


def test_a_document_over_the_size_bound_is_refused() -> None:
    doc = _doc("big")
    doc["nodes"]["root"]["steps"][0]["path"] = "/" + "x" * graphs_store.MAX_DOCUMENT_BYTES
    with pytest.raises(InvalidArgument, match=r"^document_json: at most 65536 bytes, got \d+$"):
        check_document(_js(doc), "team-a")


async def test_each_namespace_holds_a_bounded_number_of_graphs(
    store: StateStore, names: list[str]
) -> None:
    graphs = GraphStore(store, max_per_namespace=2)
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    a, b, c = _name(names), _name(names), _name(names)
    await graphs.put(check_document(_js(_doc(a, ns)), ""))
    await graphs.put(check_document(_js(_doc(b, ns)), ""))
    with pytest.raises(ResourceExhausted, match=f"namespace {ns} holds 2 graphs, at most 2"):
        await graphs.put(check_document(_js(_doc(c, ns)), ""))
    assert await graphs.find(c) is None
    # Replacing one is not adding one; another namespace has its own count.
    await graphs.put(check_document(_js(_doc(a, ns, fn="other")), ""))
    await graphs.put(check_document(_js(_doc(c, ns + "x")), ""))


class _Api(GraphsApi):
    """The controller's graph RPCs on a store; this controller leads."""

    def __init__(self, store: StateStore) -> None:
        self.graphs = GraphStore(store)

    async def _forwarded(self, name: str, request: Any, context: Any) -> None:
        return None


@contextmanager
def _as(role: str, namespace: str) -> Iterator[None]:
    """Calls made as a token of role in namespace (as AccessInterceptor sets)."""
    _, rec = access.new_token("t", role, namespace)
    reset = authn._current.set(rec.principal())
    try:
        yield
    finally:
        authn._current.reset(reset)


async def test_a_developer_acts_on_its_namespace_only(store: StateStore, names: list[str]) -> None:
    api = _Api(store)
    a, b = _name(names, "a"), _name(names, "b")
    apply = controller_pb2.ApplyGraphRequest
    with _as(access.DEVELOPER, "team-a"):
        stored = await api.ApplyGraph(apply(document_json=_js(_doc(a))), None)
        assert stored.namespace == "team-a"  # the caller's, by default
        with pytest.raises(PermissionDenied, match="namespace team-b"):
            await api.ApplyGraph(apply(document_json=_js(_doc(b, "team-b"))), None)
    with _as(access.DEVELOPER, "team-b"):
        await api.ApplyGraph(apply(document_json=_js(_doc(b))), None)
        for call in (
            api.GetGraph(controller_pb2.GetGraphRequest(name=a), None),
            api.DeleteGraph(controller_pb2.DeleteGraphRequest(name=a), None),
            # Taking over a's name from another namespace is refused too.
            api.ApplyGraph(apply(document_json=_js(_doc(a))), None),
        ):
            with pytest.raises(PermissionDenied, match=f"graph {a} is in namespace team-a"):
                await call
        seen = await api.ListGraphs(controller_pb2.ListGraphsRequest(), None)
        assert b in [g.name for g in seen.graphs] and a not in [g.name for g in seen.graphs]
    with _as(access.INVOKER, "team-a"):  # an invoker reads (so runs) its graphs
        got = await api.GetGraph(controller_pb2.GetGraphRequest(name=a), None)
        assert got.name == a
    with _as(access.ADMIN, ""):
        # An admin sees both, and may not move a graph between namespaces.
        seen = await api.ListGraphs(controller_pb2.ListGraphsRequest(), None)
        assert {a, b} <= {g.name for g in seen.graphs}
        with pytest.raises(FailedPrecondition, match=r"^namespace: graph .* team-a"):
            await api.ApplyGraph(apply(document_json=_js(_doc(a, "team-b"))), None)
        await api.DeleteGraph(controller_pb2.DeleteGraphRequest(name=a), None)
    assert await api.graphs.find(a) is None and await api.graphs.find(b) is not None


@pytest.mark.parametrize(
    ("method", "role", "allowed"),
    [("GetGraph", access.INVOKER, True), ("ListGraphs", access.INVOKER, False),
     ("ApplyGraph", access.INVOKER, False), ("DeleteGraph", access.INVOKER, False),
     ("ApplyGraph", access.DEVELOPER, True), ("DeleteGraph", access.DEVELOPER, True)],
)  # fmt: skip
def test_which_roles_may_call_the_graph_rpcs(method: str, role: str, allowed: bool) -> None:
    _, rec = access.new_token("t", role, "team-a")
    refusal = access.decide(f"/galaxy.v1.Controller/{method}", rec.principal())
    assert (refusal is None) == allowed
    anonymous = access.decide(f"/galaxy.v1.Controller/{method}", access.ANONYMOUS_PRINCIPAL)
    assert anonymous is not None and anonymous.code == "UNAUTHENTICATED"
