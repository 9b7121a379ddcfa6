"""Inference graph specs (KServe's InferenceGraph, in Galaxy's terms): parse
and check a graph document, naming the field of the first error. Pure.

A graph is named nodes, one of them ``root``; a node routes among its steps
(``router``: Sequence, Ensemble, Splitter or Switch), and a step calls either
a Galaxy function (``function``) or another node (``node``)::

    name: iris-ensemble
    namespace: default   # optional: the applying caller's by default
    nodes:
      root:
        router: Sequence
        steps:
          - {name: prep, function: iris-prep}
          - {name: vote, node: classifiers, data: $response}
      classifiers:
        router: Ensemble
        steps:
          - {name: forest, function: iris}
          - {name: tree, function: iris-tree}

Whether a step's function exists is not checked here: functions are deployed
and deleted independently of graphs, so a call to a missing one is answered
at request time (404 naming the step), as KServe answers a graph whose
InferenceService is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonpointer

from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.validation import check_name, key, short

ROUTERS = ("Sequence", "Ensemble", "Splitter", "Switch")
#: Comparisons a Switch condition may make (docs/models.md, graphs).
OPS = ("==", "!=", "<", "<=", ">", ">=", "in")
#: Bounds: a graph is configuration, not data.
MAX_NODES = 32
MAX_STEPS = 16
MAX_TIMEOUT_MS = 3_600_000
DEFAULT_TIMEOUT_MS = 30_000
#: Function calls one request may make at most (nested Ensembles multiply).
MAX_CALLS = 64


@dataclass(frozen=True)
class Condition:
    """A Switch step's test: the value at ``pointer`` (RFC 6901) in the
    request body compared with ``value`` by ``op``."""

    pointer: str
    op: str
    value: Any


@dataclass(frozen=True)
class Step:
    """One step: a function call or another node."""

    name: str
    function: str = ""
    node: str = ""
    #: path on the function's instance (default: its KServe v1 :predict)
    path: str = ""
    #: "$request" (the node's input) or "$response" (the previous step's
    #: answer; Sequence only)
    data: str = "$request"
    weight: int = 0
    condition: Condition | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def target_path(self) -> str:
        """The path a function step is sent to on its instance."""
        return self.path or f"/v1/models/{self.function}:predict"


@dataclass(frozen=True)
class Node:
    """A router over steps."""

    name: str
    router: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Graph:
    """A checked inference graph."""

    name: str
    nodes: dict[str, Node]
    #: "" when the document names none (the controller gives it the
    #: caller's, as for a function)
    namespace: str = ""

    @property
    def root(self) -> Node:
        """The node a request enters."""
        return self.nodes["root"]


def _mapping(doc: Any, field: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{field}: must be a mapping, got {type(doc).__name__}")
    return doc


def _only(doc: dict[str, Any], allowed: tuple[str, ...], field: str) -> None:
    for k in doc:
        if k not in allowed:
            where = f"{field}.{key(k)}" if field else key(k)
            raise InvalidArgument(f"{where}: unknown field (allowed: {', '.join(allowed)})")


def _int(doc: dict[str, Any], name: str, field: str, default: int, lo: int, hi: int) -> int:
    v = doc.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidArgument(f"{field}.{name}: an integer in [{lo}, {hi}], got {short(v)}")
    return v


def _condition(doc: Any, field: str) -> Condition:
    c = _mapping(doc, field)
    _only(c, ("pointer", "op", "value"), field)
    pointer = c.get("pointer")
    if not isinstance(pointer, str):
        raise InvalidArgument(f"{field}.pointer: required, a JSON pointer such as /instances/0/0")
    try:
        jsonpointer.JsonPointer(pointer)
    except jsonpointer.JsonPointerException as e:
        raise InvalidArgument(f"{field}.pointer: not a JSON pointer ({e})") from None
    op = c.get("op", "==")
    if op not in OPS:
        raise InvalidArgument(f"{field}.op: one of {', '.join(OPS)}, got {short(op)}")
    if "value" not in c:
        raise InvalidArgument(f"{field}.value: required")
    value = c["value"]
    if op == "in" and not isinstance(value, list):
        raise InvalidArgument(f"{field}.value: a list for op 'in', got {short(value)}")
    return Condition(pointer, op, value)


def _step(doc: Any, field: str, router: str) -> Step:
    s = _mapping(doc, field)
    _only(s, ("name", "function", "node", "path", "data", "weight", "condition", "timeout_ms"),
          field)  # fmt: skip
    name = check_name(f"{field}.name", s.get("name", ""))
    function, node = s.get("function", ""), s.get("node", "")
    if bool(function) == bool(node):
        raise InvalidArgument(f"{field}: exactly one of function or node is required")
    if function:
        check_name(f"{field}.function", function)
    if not isinstance(node, str):
        raise InvalidArgument(f"{field}.node: a node name, got {short(node)}")
    path = s.get("path", "")
    if not isinstance(path, str) or (path and not path.startswith("/")) or len(path) > 1024:
        raise InvalidArgument(f"{field}.path: a path starting with '/', got {short(path)}")
    if path and node:
        raise InvalidArgument(f"{field}.path: only for a function step")
    data = s.get("data", "$request")
    if data not in ("$request", "$response"):
        raise InvalidArgument(f"{field}.data: $request or $response, got {short(data)}")
    if data == "$response" and router != "Sequence":
        raise InvalidArgument(f"{field}.data: $response only in a Sequence")
    weight = _int(s, "weight", field, 0, 0, 100)
    if router == "Splitter" and "weight" not in s:
        raise InvalidArgument(f"{field}.weight: required in a Splitter (percent)")
    if router != "Splitter" and "weight" in s:
        raise InvalidArgument(f"{field}.weight: only in a Splitter")
    condition = None
    if "condition" in s:
        if router != "Switch":
            raise InvalidArgument(f"{field}.condition: only in a Switch")
        condition = _condition(s["condition"], f"{field}.condition")
    elif router == "Switch":
        raise InvalidArgument(f"{field}.condition: required in a Switch")
    timeout = _int(s, "timeout_ms", field, DEFAULT_TIMEOUT_MS, 1, MAX_TIMEOUT_MS)
    return Step(name, function, node, path, data, weight, condition, timeout)


def _node(doc: Any, field: str, name: str) -> Node:
    n = _mapping(doc, field)
    _only(n, ("router", "steps"), field)
    router = n.get("router")
    if router not in ROUTERS:
        raise InvalidArgument(f"{field}.router: one of {', '.join(ROUTERS)}, got {short(router)}")
    steps_doc = n.get("steps")
    if not isinstance(steps_doc, list) or not 1 <= len(steps_doc) <= MAX_STEPS:
        raise InvalidArgument(f"{field}.steps: a list of 1 to {MAX_STEPS} steps")
    steps = tuple(_step(s, f"{field}.steps[{i}]", router) for i, s in enumerate(steps_doc))
    seen: set[str] = set()
    for i, s in enumerate(steps):
        if s.name in seen:
            raise InvalidArgument(f"{field}.steps[{i}].name: {s.name} used twice in this node")
        seen.add(s.name)
    if router == "Splitter" and sum(s.weight for s in steps) != 100:
        total = sum(s.weight for s in steps)
        raise InvalidArgument(f"{field}.steps: Splitter weights must sum to 100, got {total}")
    if steps[0].data == "$response":
        raise InvalidArgument(f"{field}.steps[0].data: the first step has no previous response")
    return Node(name, router, steps)


def _text(doc: dict[str, Any], field: str) -> str:
    """doc[field] as a string ("" when absent); InvalidArgument otherwise."""
    value = doc.get(field, "")
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: a string, got {type(value).__name__}")
    return value


def parse(doc: Any) -> Graph:
    """The graph of a document (parsed YAML or JSON); InvalidArgument
    naming the field otherwise: unknown fields and routers, step rules,
    references to nodes that do not exist, cycles."""
    g = _mapping(doc, "graph")
    _only(g, ("name", "namespace", "nodes"), "")
    name = check_name("name", _text(g, "name"))
    namespace = check_name("namespace", ns) if (ns := _text(g, "namespace")) else ""
    nodes_doc = _mapping(g.get("nodes"), "nodes")
    if not 1 <= len(nodes_doc) <= MAX_NODES:
        raise InvalidArgument(f"nodes: 1 to {MAX_NODES} nodes")
    nodes = {}
    for k, v in nodes_doc.items():
        nodes[k] = _node(v, f"nodes.{key(k)}", check_name(f"nodes.{key(k)}", k))
    if "root" not in nodes:
        raise InvalidArgument("nodes.root: required (the node a request enters)")
    for n in nodes.values():
        for i, s in enumerate(n.steps):
            if s.node and s.node not in nodes:
                raise InvalidArgument(
                    f"nodes.{n.name}.steps[{i}].node: no node {short(s.node)} in this graph"
                )
    _check_acyclic(nodes)
    if (calls := _calls(nodes, "root")) > MAX_CALLS:
        raise InvalidArgument(
            f"nodes: a request may make {calls} function calls, at most {MAX_CALLS} allowed"
        )
    return Graph(name, nodes, namespace)


def _calls(nodes: dict[str, Node], name: str) -> int:
    """The most function calls a request through node ``name`` makes."""
    node = nodes[name]
    each = [1 if s.function else _calls(nodes, s.node) for s in node.steps]
    return sum(each) if node.router in ("Sequence", "Ensemble") else max(each)


def _check_acyclic(nodes: dict[str, Node]) -> None:
    """InvalidArgument naming a step that closes a cycle (a graph must end)."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        # path: the nodes entered to get here, ending with name
        if name in done:
            return
        for i, s in enumerate(nodes[name].steps):
            if not s.node:
                continue
            if s.node in path:
                cycle = " -> ".join((*path[path.index(s.node) :], s.node))
                raise InvalidArgument(f"nodes.{name}.steps[{i}].node: makes a cycle ({cycle})")
            visit(s.node, (*path, s.node))
        done.add(name)

    for n in nodes:
        visit(n, (n,))
