"""``galaxy bench`` LLM plans: the Azure LLM inference trace, open loop,
through the gateway's OpenAI routes of a real ``galaxy up``.

A bench file with ``kind: llm`` (experiments/llm-azure.yaml)::

    kind: llm
    name: llm-azure-conv
    nodes: 2                        # galaxy up --nodes
    trace: {service: conv, duration_s: 60, time_scale: 1.0}
    limits: {ttft_s: 1.0, tpot_s: 0.1}   # goodput counts requests within both
    plans:
      - {label: emulated x2, spec: examples/llm-emulated.yaml, instances: 2}
    recommend: {instances: [1, 2, 4, 8]}  # what --recommend tries, smallest first

Each plan deploys its spec at a fixed number of instances (min = max scale)
and replays the trace window against it; ``--recommend --slo
'p99_ttft<1s,p99_tpot<100ms'`` replays it against the first plan's spec at
each count of ``recommend.instances`` and names the smallest that meets
every objective with no failed request. Definitions: ``llmmetrics``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controlplane.bench import llmclient, llmreport
from controlplane.bench import llmmetrics as mt
from controlplane.bench import llmtrace as tr
from controlplane.bench.llmup import Up, write_text
from controlplane.bench.trace import TraceError

REPO = Path(__file__).resolve().parents[2]
MAX_PLANS = 16
MAX_INSTANCES = 512


@dataclass(frozen=True)
class Plan:
    """One deployment to measure."""

    label: str
    spec: Path
    instances: int
    prompt: str  # "tokens" or "text" (llmclient.Target)


@dataclass(frozen=True)
class LlmBench:
    """A parsed ``kind: llm`` bench file."""

    file: Path
    name: str
    nodes: int
    window: tr.TraceWindow
    limits: mt.Limits
    plans: list[Plan]
    recommend_instances: list[int]


def is_llm_file(path: str) -> bool:
    """Is this bench file an LLM bench (``kind: llm``)?"""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False  # the ordinary loader reports the error
    return isinstance(doc, dict) and doc.get("kind") == "llm"


def _path(p: str) -> Path:
    q = Path(p)
    return q if q.is_absolute() else REPO / q


def _int(d: dict[str, Any], key: str, field: str, lo: int, hi: int, default: int) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or not lo <= v <= hi:
        raise TraceError(f"{field}: an integer in {lo}..{hi}")
    return v


def load_file(path: str) -> LlmBench:
    """Parse and check a bench file; errors name the field."""
    doc = yaml.safe_load(Path(path).read_text())
    window = tr.TraceWindow.from_dict(doc.get("trace") or {})
    lim = doc.get("limits") or {}
    limits = mt.Limits(lim.get("ttft_s"), lim.get("tpot_s"))
    raw = doc.get("plans") or []
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_PLANS:
        raise TraceError(f"plans: a list of 1..{MAX_PLANS} plans")
    plans = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or "spec" not in p:
            raise TraceError(f"plans[{i}].spec: required (a function spec file)")
        n = _int(p, "instances", f"plans[{i}].instances", 1, MAX_INSTANCES, 1)
        prompt = p.get("prompt", "tokens")
        if prompt not in ("tokens", "text"):
            raise TraceError(f"plans[{i}].prompt: tokens or text")
        spec = _path(str(p["spec"]))
        if not spec.is_file():
            raise TraceError(f"plans[{i}].spec: no such file")
        plans.append(Plan(str(p.get("label", f"{spec.stem} x{n}")), spec, n, prompt))
    rec = (doc.get("recommend") or {}).get("instances", [1, 2, 4, 8])
    if not isinstance(rec, list) or not all(
        isinstance(x, int) and 1 <= x <= MAX_INSTANCES for x in rec
    ):
        raise TraceError(f"recommend.instances: a list of integers in 1..{MAX_INSTANCES}")
    nodes = _int(doc, "nodes", "nodes", 1, 256, 1)
    name = str(doc.get("name", Path(path).stem))
    return LlmBench(Path(path), name, nodes, window, limits, plans, sorted(set(rec)))


def _env() -> dict[str, str]:
    # Instances run `python3`: this interpreter's, which has the emulated
    # server's and llama-cpp-python's packages (an activated virtualenv).
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


async def measure(
    up: Up, plan: Plan, schedule: list[tr.LlmRequest], limits: mt.Limits, out: Path
) -> dict[str, Any]:
    """Deploy one plan and replay the schedule against it."""
    t0 = time.monotonic()
    name = await up.deploy(plan.spec, plan.instances, out / "specs")
    ready_s = time.monotonic() - t0
    target = llmclient.Target(f"http://{up.gateway}/v1", name, up.token, plan.prompt)
    records, wall = await llmclient.run(target, schedule)
    s = mt.summarize(records, wall, limits)
    s.update(label=plan.label, spec=str(plan.spec), instances=plan.instances)
    s.update(prompt=plan.prompt, deploy_to_ready_s=ready_s)
    s["_samples"] = [
        {"sent": r.sent, "chunks": r.chunks, "done": r.done, "n_out": r.n_out, "error": r.error}
        for r in records
    ]
    return s


def _header(b: LlmBench, schedule: list[tr.LlmRequest], command: str) -> dict[str, Any]:
    span = schedule[-1].at_s if schedule else 0.0
    return {
        "experiment": b.name,
        "file": str(b.file),
        "command": command,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg": list(os.getloadavg()),
        },
        "trace": {
            **b.window.__dict__,
            "requests": len(schedule),
            "replay_s": span,
            "offered_per_s": len(schedule) / span if span else None,
        },
        "definitions": mt.__doc__,
    }


async def run(b: LlmBench, out: Path, data_dir: Path, command: str) -> dict[str, Any]:
    """Every plan of the file on one `galaxy up`; writes the report."""
    schedule = tr.load(data_dir, b.window)
    res = _header(b, schedule, command)
    res["plans"], res["failures"] = [], []
    up = Up(out / "run", b.nodes, _env())
    await up.start()
    try:
        for p in b.plans:
            try:
                res["plans"].append(await measure(up, p, schedule, b.limits, out))
            except RuntimeError as e:
                res["failures"].append({"label": p.label, "error": str(e)[:500]})
    finally:
        await up.stop()
    res["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    llmreport.write_all(res, out)
    return res


async def recommend(
    b: LlmBench, objectives: list[mt.Objective], out: Path, data_dir: Path, command: str
) -> dict[str, Any]:
    """The smallest instance count of the first plan that meets the SLO."""
    schedule = tr.load(data_dir, b.window)
    doc = _header(b, schedule, command)
    doc.update(objectives=[o.text for o in objectives], trials=[], recommendation=None)
    base = b.plans[0]
    up = Up(out / "run", b.nodes, _env())
    await up.start()
    try:
        for n in b.recommend_instances:
            plan = Plan(f"{base.spec.stem} x{n}", base.spec, n, base.prompt)
            s = await measure(up, plan, schedule, b.limits, out)
            s.pop("_samples")
            why = [f"{o.text}: measured {o.measure(s):.1f}" for o in objectives if not o.met(s)]
            if s["requests"]["errors"]:
                why.append(f"{s['requests']['errors']} of {s['requests']['sent']} failed")
            doc["trials"].append({"instances": n, "passed": not why, "why": why, "summary": s})
            if not why:
                doc["recommendation"] = n
                break
    finally:
        await up.stop()
    write_text(out / "recommend.json", json.dumps(llmreport.clean(doc), indent=2) + "\n")
    write_text(out / "recommend.md", llmreport.render_recommendation(doc))
    return doc
