"""Run systems on a workload and collect comparable results.

``SYSTEMS`` names every model: ``galaxy`` (full) and its ablation variants
``G1``, ``Gn``, ``Gn-C``, and the baselines ``knative``, ``sparrow``,
``ray``, ``atoll``. Each system gets a fresh ``Env`` built from the same
seed, so all replay identical arrivals and draw network and service times
from identically seeded streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from simulator.baselines import atoll, knative, ray, sparrow
from simulator.calibration import Calibration
from simulator.engine import Batch, Progress
from simulator.galaxy import VARIANTS, GalaxyModel
from simulator.metrics import Recorder
from simulator.system import Env, SimConfig, SystemModel
from simulator.workload import Workload


def _galaxy(variant: str) -> Callable[[Env, dict[str, Any]], SystemModel]:
    def make(env: Env, params: dict[str, Any]) -> SystemModel:
        m = GalaxyModel(env, VARIANTS[variant], **params)
        m.name = variant
        return m

    return make


SYSTEMS: dict[str, Callable[[Env, dict[str, Any]], SystemModel]] = {
    **{v: _galaxy(v) for v in VARIANTS},
    "knative": lambda env, p: knative.KnativeModel(env, **p),
    "sparrow": lambda env, p: sparrow.SparrowModel(env, **p),
    "ray": lambda env, p: ray.RayModel(env, **p),
    "atoll": lambda env, p: atoll.AtollModel(env, **p),
}


def run_one(
    system: str,
    workload: Workload,
    cfg: SimConfig,
    cal: Calibration,
    *,
    progress: bool = False,
    until: float | None = None,
) -> dict[str, Any]:
    """Simulate one system; its summary plus a ``perf`` entry (wall time,
    events/s) that is kept out of the reproducible results."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
    env = Env(cfg, cal, workload, cfg.seed)
    model = SYSTEMS[system](env, dict(cfg.params.get(system, {})))
    end = workload.duration_s if until is None else until
    bar = Progress(system, end) if progress else None
    t0 = time.perf_counter()
    model.start()
    env.sim.run(end, _counted(workload.batches(), env.rec), model.arrivals(), bar)
    model.finish()
    # The CPU of every process of the system (control plane and request
    # routing; node agents and sandboxes are alike in every design): the
    # denominator of throughput per control-plane core.
    # Not for a model whose stations stand for fitted latencies rather than
    # CPU (``platform_cpu`` False: Knative-like): its figure would mean nothing.
    if getattr(model, "platform_cpu", True):
        env.rec.add("cpu_s.platform", sum(st.busy for st in env.stations))
    wall = time.perf_counter() - t0
    out = env.rec.summary(env.sim.now)
    out["system"] = system
    out["params"] = model.params()
    out["perf"] = {
        "events": env.sim.events,
        "wall_s": wall,
        "events_per_s": env.sim.events / wall if wall > 0 else 0.0,
        "sim_s": env.sim.now,
    }
    return out


def _counted(batches: Iterator[Batch], rec: Recorder) -> Iterator[Batch]:
    """The batches, each counted into the arrival series as it is read."""
    for b in batches:
        rec.arrived(b[0])
        yield b


def run_many(
    systems: list[str],
    workload: Workload,
    cfg: SimConfig,
    cal: Calibration,
    *,
    progress: bool = False,
    until: float | None = None,
) -> dict[str, dict[str, Any]]:
    """run_one for each system, in order."""
    return {s: run_one(s, workload, cfg, cal, progress=progress, until=until) for s in systems}


def with_params(cfg: SimConfig, system: str, **params: Any) -> SimConfig:
    """cfg with extra parameters for one system."""
    merged = {**cfg.params, system: {**cfg.params.get(system, {}), **params}}
    return replace(cfg, params=merged)
