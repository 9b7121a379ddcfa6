"""The adaptive-batching bench (``kind: batching``): the iris runtime with and
without the gateway's batcher, at saturation and under open-loop load.

    galaxy bench -f experiments/batching.yaml --out results/batching

A real ``galaxy up --nodes 1`` (``llmup.Up``) serves two deployments of the
iris classifier at ``max_scale: 1``: ``iris`` and ``iris-b`` with the plan's
``batching``. Per run: each one's saturation (a closed loop of
``closed_workers``, answered per second: X without, Xb with), then open
loops of ``seconds``: ``iris`` at X/2 and at X, ``iris-b`` at 2X. The goals
(docs/models.md): Xb >= 2X, and ``iris-b``'s p99 at 2X no worse than
``iris``'s at half that load (X). Results in ``results.json`` and
``report.md``; the exit code is 1 when a goal is missed.

The runtime runs ``python3`` with scikit-learn: the bench puts its own
interpreter's directory first on the control plane's PATH (the ``models``
extra), and trains the model from scikit-learn's data when it is missing.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from controlplane.bench import batchload
from controlplane.bench.llmup import Up

PLAN_KIND = "batching"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
_KEYS: dict[str, tuple[type, float, float]] = {
    "runs": (int, 1, 10),
    "seconds": (float, 0.5, 120),
    "closed_workers": (int, 1, 1024),
    "max_batch_size": (int, 2, 1024),
    "max_latency_ms": (int, 1, 10_000),
}
DEFAULTS: dict[str, Any] = {
    "runs": 1, "seconds": 10.0, "closed_workers": 64, "max_batch_size": 32, "max_latency_ms": 10,
}  # fmt: skip


def load_plan(doc: Any) -> dict[str, Any] | None:
    """The ``batching`` block of a bench file of ``kind: batching`` (None for
    any other bench file); ``ValueError`` naming a bad field."""
    if not isinstance(doc, dict) or doc.get("kind") != PLAN_KIND:
        return None
    block = doc.get("batching") or {}
    if not isinstance(block, dict):
        raise ValueError("batching: a mapping of " + ", ".join(_KEYS))
    out = dict(DEFAULTS)
    for key, value in block.items():
        rule = _KEYS.get(str(key))
        if rule is None:
            raise ValueError(f"batching.{str(key)[:40]}: unknown (known: {', '.join(_KEYS)})")
        kind, lo, hi = rule
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"batching.{key}: a number from {lo:g} to {hi:g}")
        if kind is int and value != int(value):
            raise ValueError(f"batching.{key}: a whole number")
        if not lo <= value <= hi:
            raise ValueError(f"batching.{key}: from {lo:g} to {hi:g}")
        out[str(key)] = kind(value)
    return out


def _spec(name: str, model: Path, batching: dict[str, float] | None) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "iris.yaml").read_text())
    doc.update(name=name, max_scale=1, min_scale=0, artifact=str(EXAMPLES / doc["artifact"]))
    doc["model"]["uri"] = str(model)
    if batching:
        doc["batching"] = batching
    return dict(doc)


def _model(work: Path) -> Path:
    shipped = EXAMPLES / "models" / "iris.joblib"
    if shipped.exists():
        return shipped
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from train_iris import train  # scripts/train_iris.py: the one way it is made
    finally:
        sys.path.pop(0)
    path = work / "iris.joblib"
    train(path)
    return path


async def _one_run(up: Up, plan: dict[str, Any]) -> dict[str, Any]:
    url = {f: f"http://{up.gateway}/v1/models/{f}:predict" for f in ("iris", "iris-b")}
    s, w = plan["seconds"], plan["closed_workers"]
    x = (await batchload.closed(url["iris"], w, s))["answered_per_s"]
    xb = (await batchload.closed(url["iris-b"], w, s))["answered_per_s"]
    if x <= 0:
        raise RuntimeError("iris answered nothing at saturation")
    return {
        "saturation_per_s": {"without": x, "with": xb},
        "without_at_half_x": await batchload.open_loop(url["iris"], x / 2, s),
        "without_at_x": await batchload.open_loop(url["iris"], x, s),
        "with_at_2x": await batchload.open_loop(url["iris-b"], 2 * x, s),
    }


def judge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The goals over the runs' medians (pure)."""
    ratio = statistics.median(r["saturation_per_s"]["with"] / r["saturation_per_s"]["without"]
                              for r in runs)  # fmt: skip
    p99_with = statistics.median(r["with_at_2x"]["p99_ms"] for r in runs)
    p99_without = statistics.median(r["without_at_x"]["p99_ms"] for r in runs)
    errors = sum(r[k]["errors"] for r in runs for k in ("without_at_x", "with_at_2x"))
    missed = []
    if ratio < 2.0:
        missed.append(f"throughput with batching {ratio:.2f}x, goal 2x")
    if p99_with > p99_without:
        missed.append(
            f"p99 with batching at 2X {p99_with:.2f} ms > without at X {p99_without:.2f} ms"
        )
    if errors:
        missed.append(f"{errors} requests failed in the open loops")
    return {"throughput_ratio": ratio, "p99_ms_with_at_2x": p99_with,
            "p99_ms_without_at_x": p99_without, "goals_missed": missed}  # fmt: skip


def render(report: dict[str, Any]) -> str:
    """The report as text."""
    lines = ["run  X/s (without)  Xb/s (with)  p99 without X/2  p99 without X  p99 with 2X"]
    for i, r in enumerate(report["runs"], 1):
        sat = r["saturation_per_s"]
        lines.append(
            f"{i:<4} {sat['without']:>14.1f} {sat['with']:>12.1f} "
            f"{r['without_at_half_x']['p99_ms']:>14.2f} ms {r['without_at_x']['p99_ms']:>11.2f} ms "
            f"{r['with_at_2x']['p99_ms']:>9.2f} ms"
        )
    v = report["verdict"]
    lines.append(f"throughput ratio {v['throughput_ratio']:.2f}x (goal 2x)")
    lines += [f"missed: {m}" for m in v["goals_missed"]]
    return "\n".join(lines)


async def run_plan(plan: dict[str, Any], out: Path) -> int:
    """``galaxy bench`` of a batching file: measure, write, judge (exit 2
    with the reason when the control plane or a deployment fails)."""
    try:
        return await _run_plan(plan, out)
    except (RuntimeError, OSError) as e:  # UpError is a RuntimeError
        print(f"galaxy bench: batching: {e}", file=sys.stderr)
        return 2


async def _run_plan(plan: dict[str, Any], out: Path) -> int:
    batching = {"max_batch_size": plan["max_batch_size"], "max_latency_ms": plan["max_latency_ms"]}
    with tempfile.TemporaryDirectory(prefix="galaxy-bench-batching-") as tmp:
        work = Path(tmp)
        model = _model(work)
        path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
        up = Up(work / "run", nodes=1, env={"PATH": path})
        await up.start()
        try:
            for name, b in (("iris", None), ("iris-b", batching)):
                f = work / f"{name}.yaml"
                f.write_text(yaml.safe_dump(_spec(name, model, b)))
                await up.cli("deploy", "-f", str(f))
            runs = [await _one_run(up, plan) for _ in range(plan["runs"])]
        finally:
            await up.stop()
    verdict = judge(runs)
    report: dict[str, Any] = {"plan": plan, "runs": runs, "verdict": verdict}
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local, instant
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    (out / "report.md").write_text("```\n" + text + "\n```\n")
    print(text)
    return 1 if verdict["goals_missed"] else 0
