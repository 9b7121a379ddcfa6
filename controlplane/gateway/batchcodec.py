"""Merging requests into one batch and splitting its answer back, for
KServe v1 (``instances`` -> ``predictions``) and the Open Inference Protocol
v2 (``inputs`` -> ``outputs``, rows along the first dimension). Pure.

Only plain requests merge: a v1 body with nothing but ``instances``, a v2
body with nothing but ``inputs`` whose tensors carry flat ``data`` of the
declared shape and agree on the row count. Anything else (parameters, an
``id``, named outputs, nested data) is ``Unbatchable`` and is sent alone, as
it came: batching never changes what a request means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class Unbatchable(ValueError):
    """A request that cannot join a batch (it is sent alone)."""


class BadAnswer(ValueError):
    """A batch's answer that cannot be split back (every caller gets 502)."""


@dataclass(frozen=True)
class Part:
    """One caller's share of a batch: requests with equal keys can merge."""

    protocol: str
    key: tuple[Any, ...]
    rows: int
    doc: dict[str, Any]


def part(protocol: str, doc: Any) -> Part:
    """The part of a request body (parsed JSON) for ``protocol`` (``v1`` or
    ``v2``); Unbatchable when it is not a plain request."""
    if not isinstance(doc, dict):
        raise Unbatchable("not a JSON object")
    if protocol == "v1":
        rows = doc.get("instances")
        if set(doc) != {"instances"} or not isinstance(rows, list) or not rows:
            raise Unbatchable("not a plain v1 request")
        return Part("v1", ("v1",), len(rows), doc)
    inputs = doc.get("inputs")
    if set(doc) != {"inputs"} or not isinstance(inputs, list) or not inputs:
        raise Unbatchable("not a plain v2 request")
    key: list[Any] = ["v2"]
    n = -1
    for t in inputs:
        shape = t.get("shape") if isinstance(t, dict) else None
        if (
            not isinstance(t, dict)
            or set(t) != {"name", "shape", "datatype", "data"}
            or not isinstance(shape, list)
            or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or not isinstance(t["data"], list)
            or len(t["data"]) != math.prod(shape)
            or any(isinstance(x, list) for x in t["data"][:1])
            or (n >= 0 and shape[0] != n)
        ):
            raise Unbatchable("not a plain v2 tensor")
        n = shape[0]
        key.append((t["name"], t["datatype"], tuple(shape[1:])))
    if n <= 0:
        raise Unbatchable("no rows")
    return Part("v2", tuple(key), n, doc)


def merge(parts: list[Part]) -> dict[str, Any]:
    """One request holding every part's rows, in order."""
    if parts[0].protocol == "v1":
        return {"instances": [row for p in parts for row in p.doc["instances"]]}
    total = sum(p.rows for p in parts)
    merged = []
    for i, t in enumerate(parts[0].doc["inputs"]):
        merged.append({
            "name": t["name"], "datatype": t["datatype"], "shape": [total, *t["shape"][1:]],
            "data": [x for p in parts for x in p.doc["inputs"][i]["data"]],
        })  # fmt: skip
    return {"inputs": merged}


def split(parts: list[Part], answer: Any) -> list[dict[str, Any]]:
    """Each part's answer, in order, from the batch's answer; BadAnswer when
    its rows do not add up to the batch's."""
    total = sum(p.rows for p in parts)
    if not isinstance(answer, dict):
        raise BadAnswer("the batch's answer is not a JSON object")
    if parts[0].protocol == "v1":
        preds = answer.get("predictions")
        if not isinstance(preds, list) or len(preds) != total:
            raise BadAnswer(f"the batch's answer has no predictions list of {total} rows")
        out, at = [], 0
        for p in parts:
            out.append({"predictions": preds[at : at + p.rows]})
            at += p.rows
        return out
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        raise BadAnswer("the batch's answer has no outputs list")
    for t in outputs:
        shape = t.get("shape") if isinstance(t, dict) else None
        if (
            not isinstance(shape, list)
            or not shape
            or shape[0] != total
            or not isinstance(t.get("data"), list)
            or len(t["data"]) != math.prod(shape)
        ):
            raise BadAnswer(f"an output of the batch's answer is not {total} rows of flat data")
    rest = {k: v for k, v in answer.items() if k != "outputs"}
    out, at = [], 0
    for p in parts:
        mine = []
        for t in outputs:
            per_row = math.prod(t["shape"][1:])
            rows = t["data"][at * per_row : (at + p.rows) * per_row]
            mine.append(t | {"shape": [p.rows, *t["shape"][1:]], "data": rows})
        out.append(rest | {"outputs": mine})
        at += p.rows
    return out
