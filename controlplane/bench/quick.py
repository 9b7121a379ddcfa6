"""``galaxy bench --quick``: a bench file in a short form that still runs every
scenario on a real control plane, end to end.

A shipped plan takes minutes on 210 emulated nodes; its short form checks that
the plan runs (every scenario, its
report), not its figures: one configuration (each swept parameter's first
value), and no wait for the control plane to go quiet before the echo after
a plan. The short form is a rewrite of the YAML document
before validation, so the plan's own checks apply to it unchanged.
"""

from __future__ import annotations

from typing import Any

#: Emulated nodes at most (the plan's value when smaller).
QUICK_NODES = 4
#: Requests per scenario and warm-up requests at most.
QUICK_REQUESTS = 40
QUICK_WARMUP = 5
#: Echo requests of the load generator's own check, and a plan's time limit.
QUICK_ECHO_REQUESTS = 40
QUICK_MAX_DURATION_S = 30.0
#: Configurations a swept parameter keeps (its first distinct values).
QUICK_SWEEP = 1


def _distinct(values: list[Any], keep: int) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out[:keep]


def shorten(doc: Any) -> Any:
    """The short form of a bench file's YAML document; anything that is not
    the expected shape is left as it is, for validation to name."""
    if not isinstance(doc, dict):
        return doc
    doc = dict(doc)
    cp = doc.get("control_plane")
    if isinstance(cp, dict) and isinstance(cp.get("nodes"), int):
        doc["control_plane"] = {**cp, "nodes": min(cp["nodes"], QUICK_NODES)}
    load = doc.get("load")
    if isinstance(load, dict):
        load = dict(load)
        if isinstance(load.get("echo_requests"), int):
            load["echo_requests"] = min(load["echo_requests"], QUICK_ECHO_REQUESTS)
        limit = load.get("max_duration_s", QUICK_MAX_DURATION_S)
        if isinstance(limit, int | float):
            load["max_duration_s"] = min(limit, QUICK_MAX_DURATION_S)
        doc["load"] = load
    params = doc.get("parameters")
    if isinstance(params, list):
        doc["parameters"] = [_shorter_sweep(p) for p in params]
    scenarios = doc.get("scenarios")
    if isinstance(scenarios, list):
        doc["scenarios"] = [_shorter_scenario(s) for s in scenarios]
    return doc


def _shorter_sweep(p: Any) -> Any:
    if not isinstance(p, dict) or not isinstance(p.get("value"), list):
        return p
    values = p["value"]
    if p.get("name") == "nodes":
        values = [min(v, QUICK_NODES) if isinstance(v, int) else v for v in values]
    return {**p, "value": _distinct(values, QUICK_SWEEP)}


def _shorter_scenario(s: Any) -> Any:
    if not isinstance(s, dict):
        return s
    s = dict(s)
    for key, most in (("total_requests", QUICK_REQUESTS), ("warmup_requests", QUICK_WARMUP)):
        if isinstance(s.get(key), int):
            s[key] = min(s[key], most)
    if isinstance(s.get("max_duration_s"), int | float):
        s["max_duration_s"] = min(s["max_duration_s"], QUICK_MAX_DURATION_S)
    return s
