"""The inference graph planner: from a graph, its request and the answers so
far, the function calls to make next. Pure (no I/O; the Splitter's random
draw is injected); the gateway makes the calls (``graphs/runner.py``).

How each router uses its steps (KServe's InferenceGraph semantics):

- Sequence: steps one after another; a step with ``data: $response`` gets
  the previous step's answer, else the node's input. The node's answer is
  the last step's.
- Ensemble: every step at once on the node's input; the node's answer is
  ``{step name: step answer}``.
- Splitter: one step, drawn by weight (percent), on the node's input.
- Switch: the first step whose condition holds on the node's input; when
  none holds the node answers its input unchanged (as KServe does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonpointer

from controlplane.runtime.graphspec import Condition, Graph, Node, Step


@dataclass(frozen=True)
class Call:
    """One function call the gateway is to make."""

    #: where the step is: ``node.step`` from the root, e.g. ``root.vote.tree``
    step: str
    function: str
    path: str
    body: Any
    timeout_s: float
    #: the frame and step index the answer goes back to (``Plan.answer``)
    frame: _Frame
    index: int


def holds(cond: Condition, doc: Any) -> bool:
    """Whether a Switch condition holds on a JSON document. A pointer that
    resolves to nothing reads as null (so ``!= x`` holds and ``== x`` does
    not, for any x but null); values that do not compare (a string < a
    number, null < 1) do not hold."""
    try:
        got = jsonpointer.resolve_pointer(doc, cond.pointer, None)
    except jsonpointer.JsonPointerException:
        got = None
    v = cond.value
    try:
        match cond.op:
            case "==":
                return bool(got == v)
            case "!=":
                return bool(got != v)
            case "<":
                return bool(got < v)
            case "<=":
                return bool(got <= v)
            case ">":
                return bool(got > v)
            case ">=":
                return bool(got >= v)
            case "in":
                return bool(got in v)
    except TypeError:
        return False
    return False


class _Frame:
    """One node being run on one input."""

    def __init__(
        self, plan: Plan, node: Node, doc: Any, where: str, parent: _Frame | None, index: int
    ) -> None:
        self.plan = plan
        self.node = node
        self.doc = doc
        self.where = where
        self.parent = parent
        self.index = index
        self.results: dict[str, Any] = {}

    def begin(self) -> list[Call]:
        steps = self.node.steps
        match self.node.router:
            case "Sequence":
                return self._start(0, self.doc)
            case "Ensemble":
                return [c for i in range(len(steps)) for c in self._start(i, self.doc)]
            case "Splitter":
                return self._start(self.plan.pick(steps), self.doc)
            case _:  # Switch
                for i, s in enumerate(steps):
                    if s.condition is not None and holds(s.condition, self.doc):
                        return self._start(i, self.doc)
                return self._finish(self.doc)

    def _start(self, i: int, doc: Any) -> list[Call]:
        step = self.node.steps[i]
        where = f"{self.where}.{step.name}"
        if step.function:
            return [Call(where, step.function, step.target_path(), doc,
                         step.timeout_ms / 1000.0, self, i)]  # fmt: skip
        child = _Frame(self.plan, self.plan.graph.nodes[step.node], doc, where, self, i)
        return child.begin()

    def answer(self, i: int, doc: Any) -> list[Call]:
        steps = self.node.steps
        match self.node.router:
            case "Sequence":
                if i + 1 < len(steps):
                    nxt = steps[i + 1]
                    return self._start(i + 1, doc if nxt.data == "$response" else self.doc)
                return self._finish(doc)
            case "Ensemble":
                self.results[steps[i].name] = doc
                if len(self.results) < len(steps):
                    return []
                # In the order of the spec, whatever order the answers came in.
                return self._finish({s.name: self.results[s.name] for s in steps})
            case _:
                return self._finish(doc)

    def _finish(self, doc: Any) -> list[Call]:
        if self.parent is None:
            self.plan.finished = True
            self.plan.result = doc
            return []
        return self.parent.answer(self.index, doc)


class Plan:
    """One request through a graph: ``start`` gives the first calls, each
    ``answer`` the calls its answer makes possible; ``finished`` and
    ``result`` once the root node has answered."""

    def __init__(self, graph: Graph, request: Any, draw: Callable[[], float]) -> None:
        """draw: a uniform number in [0, 1) (the Splitter's choice)."""
        self.graph = graph
        self.request = request
        self.draw = draw
        self.finished = False
        self.result: Any = None

    def start(self) -> list[Call]:
        """The calls to make first (concurrently)."""
        return _Frame(self, self.graph.root, self.request, self.graph.root.name, None, 0).begin()

    def answer(self, call: Call, doc: Any) -> list[Call]:
        """Record a call's answer (parsed JSON); the calls to make now."""
        return call.frame.answer(call.index, doc)

    def pick(self, steps: tuple[Step, ...]) -> int:
        """A Splitter's step: step i with probability weight_i / 100."""
        x = self.draw() * 100
        acc = 0
        for i, s in enumerate(steps):
            acc += s.weight
            if x < acc:
                return i
        # Weights sum to 100: only float rounding lands here.
        return max(i for i, s in enumerate(steps) if s.weight > 0)
