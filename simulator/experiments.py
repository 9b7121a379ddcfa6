"""Workload specs, experiment files, and the four documented experiments.

Workload specs (``--workload``): ``azure2019[:minutes=N,spread=even]``,
``azure2021``, ``llm2023``, ``poisson:rate=R,duration=S,functions=N``,
``gamma:rate=R,shape=K,duration=S``, ``bursty:duration=S,trough=R,peak=X``,
a folder in the Azure 2019 format, or an experiment file (YAML, the
``controlplane.bench.experiment`` format) whose plans are each run.

Plan parameters map onto the simulation: ``nodes``, ``seed``,
``keep_alive_s``, ``create_parallelism``; ``instances`` /
``schedule_instances`` (Galaxy's n), ``probe_cache``, ``connection_cache``,
``d``, ``credits``; ``preset`` (G_1, G_n, G_n-C, G_n-CP, G_n-CPE, Galaxy);
and ``SYSTEM.KEY`` for any model parameter (e.g.
``knative.scheduler_pods_per_s``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controlplane.bench import experiment as ex
from simulator import traces
from simulator import workload as wl
from simulator.system import SimConfig

_GALAXY_KEYS = {
    "instances": "instances",
    "schedule_instances": "instances",
    "n": "instances",
    "probe_cache": "probe_cache",
    "connection_cache": "connection_cache",
    "d": "d",
    "credits": "credits",
}
_TOP_KEYS = ("nodes", "seed", "keep_alive_s", "create_parallelism")
PRESET_SYSTEM = {
    "G_1": "G1",
    "G_n": "Gn",
    "G_n-C": "Gn-C",
    "G_n-CP": "Gn-CP",
    "G_n-CPE": "Gn-CPE",
    "Galaxy": "galaxy",
}


class SpecError(ValueError):
    """A bad --workload or plan parameter; the message names it."""


def _kv(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, text.split(",")):
        k, sep, v = part.partition("=")
        if not sep:
            raise SpecError(f"workload option {part!r}: expected key=value")
        out[k.strip()] = v.strip()
    return out


def parse_workload(spec: str, seed: int) -> wl.Workload:
    """A workload from a --workload spec (not an experiment file)."""
    kind, _, rest = spec.partition(":")
    o = _kv(rest)

    def f(key: str, default: float) -> float:
        try:
            return float(o.pop(key, default))
        except ValueError:
            raise SpecError(f"workload option {key}: must be a number") from None

    if Path(spec).is_dir():  # a folder whose name holds ':' (no options then)
        kind, o = spec, {}
    if kind == "azure2019" or Path(kind).is_dir():
        # azure2019[:opts] is the shipped sample; DIR[:opts] is any folder
        folder = Path(kind) if Path(kind).is_dir() else traces.AZURE_2019
        minutes = int(f("minutes", 0)) or None
        w = traces.azure2019(folder, seed=seed, minutes=minutes, spread=o.pop("spread", "uniform"))
    elif kind == "azure2021":
        w = traces.azure2021()
    elif kind == "llm2023":
        w = traces.llm2023(concurrency=int(f("concurrency", 8)))
    elif kind == "poisson":
        w = wl.poisson(
            f("rate", 100), f("duration", 60), int(f("functions", 10)),
            mean_duration_s=f("mean_duration", 1.0), seed=seed,
        )  # fmt: skip
    elif kind == "gamma":
        w = wl.gamma(
            f("rate", 100), f("shape", 0.5), f("duration", 60), int(f("functions", 10)),
            mean_duration_s=f("mean_duration", 1.0), seed=seed,
        )  # fmt: skip
    elif kind == "bursty":
        shape = wl.BurstShape(trough_rps=f("trough", 5), peak_ratio=f("peak", 256))
        w = wl.bursty(
            f("duration", 600), shape, int(f("functions", 100)),
            mean_duration_s=f("mean_duration", 1.0), seed=seed,
        )  # fmt: skip
    else:
        raise SpecError(
            f"unknown workload {spec!r}: azure2019, azure2021, llm2023, poisson, gamma, "
            "bursty, a trace folder or an experiment file (.yaml)"
        )
    if o:
        raise SpecError(f"workload {kind}: unknown option {sorted(o)[0]!r}")
    return w


def plan_config(plan: ex.Plan, base: SimConfig) -> tuple[SimConfig, str | None]:
    """The SimConfig of a plan, and the Galaxy system a ``preset`` picks."""
    cfg, preset = base, None
    for k, v in plan.params.items():
        if k in _TOP_KEYS:
            cfg = replace(cfg, **{k: type(getattr(cfg, k))(v)})
        elif k == "preset":
            if v not in PRESET_SYSTEM:
                raise SpecError(f"parameters.preset: one of {', '.join(PRESET_SYSTEM)}, got {v!r}")
            preset = PRESET_SYSTEM[str(v)]
        elif k in _GALAXY_KEYS:
            params = {**cfg.params}
            for s in PRESET_SYSTEM.values():
                if s == "G1" and _GALAXY_KEYS[k] == "instances":
                    continue  # G_1 is one instance by definition
                params[s] = {**params.get(s, {}), _GALAXY_KEYS[k]: v}
            cfg = replace(cfg, params=params)
        elif "." in k:
            system, _, key = k.partition(".")
            params = {**cfg.params, system: {**cfg.params.get(system, {}), key: v}}
            cfg = replace(cfg, params=params)
        else:
            raise SpecError(
                f"parameters.{k}: unknown; use one of {', '.join((*_TOP_KEYS, *_GALAXY_KEYS))}, "
                "preset, or SYSTEM.KEY"
            )
    return cfg, preset


def plan_workload(plan: ex.Plan, seed: int) -> wl.Workload:
    """A plan's workload (``controlplane.bench.experiment`` arrivals)."""
    return wl.from_plan(plan, seed)


def is_experiment_file(spec: str) -> bool:
    """Does --workload name an experiment file?"""
    return spec.endswith((".yaml", ".yml")) and Path(spec).is_file()


def load_experiment(spec: str) -> ex.Experiment:
    """Parse an experiment file (SpecError on a bad one)."""
    try:
        return ex.load(spec)
    except ex.ExperimentError as e:
        raise SpecError(str(e)) from None


def plan_table(label_results: list[tuple[str, str, dict[str, Any]]]) -> list[list[str]]:
    """Rows (plan, system, metric, count, mean, stddev, p50, p90, p95, p99) in
    ms for each plan's scheduling, dispatch and cold-start latency."""
    rows = []
    for label, system, r in label_results:
        for key in ("scheduling_latency_s", "dispatch_latency_s", "cold_start_latency_s"):
            s = r[key]
            rows.append(
                [label, system, key.removesuffix("_latency_s"), str(s["count"])]
                + [f"{s[q] * 1000:.3f}" for q in ("mean", "stddev", "p50", "p90", "p95", "p99")]
            )
    return rows


PLAN_HEADER = ["plan", "system", "latency", "count", "mean", "stddev", "p50", "p90", "p95", "p99"]
