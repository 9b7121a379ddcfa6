"""Bench experiment files: control plane configs and request schedules.

A bench file is an experiment file (``controlplane.bench.experiment``, DESIGN.md
section 4) with two optional top-level blocks for what is not swept:

    control_plane: {nodes: 210, dispatch: 1, schedule: 1, clustermgr: 1,
                    state: memory, connection_cache: true, probe_cache: true,
                    start_delay_ms: 0, heartbeat_ms: 1000, gc_tuning: true}
    load: {seed: 1, echo_requests: 4000, concurrency: 16, timeout_s: 10}

Parameters may sweep any control_plane key (``dispatch_instances`` etc. are
accepted too), ``instances`` (all three control functions), ``caches`` (both
caches), ``preset`` (G_1, G_n, G_n-C, Galaxy with ``n``), and the load keys
``concurrency``, ``cold_fraction``, ``arrival_rate``, ``mode``,
``dispatch_streams``.

Scenario keys beyond the shared ones: ``mode`` (open: arrivals on schedule;
closed: ``concurrency`` workers back to back, for maximum throughput),
``concurrency``, ``rate_of: {scenario: NAME, fraction: 0.5}`` (open-loop rate
as a fraction of an earlier scenario's achieved throughput in the same
configuration), ``cold_functions``, ``warm_functions``, ``warm_hold_ms``,
``timeout_s``, ``max_duration_s``. ``request_profile: {distribution: trace,
...}`` replays the Azure trace (see ``controlplane.bench.trace``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controlplane.bench import experiment as ex
from controlplane.bench import trace as tr
from controlplane.bench.planconfig import (
    LOAD_BLOCK,
    ControlPlanePlan,
    LoadSettings,
    defaults,
    first_error,
)
from controlplane.bench.quick import shorten
from controlplane.launch.up import UpConfig
from controlplane.runtime import servingruntime, validation
from galaxy.v1 import common_pb2

#: The ``control_plane`` block's defaults (``ControlPlanePlan``).
CP_DEFAULTS: dict[str, Any] = defaults(ControlPlanePlan)
_ALIASES = {f"{k}_instances": k for k in ("dispatch", "schedule", "clustermgr")}
#: The ``load`` block's defaults (``LoadSettings``).
LOAD_DEFAULTS: dict[str, Any] = defaults(LoadSettings, LOAD_BLOCK)
LOAD_PARAMS = ("concurrency", "cold_fraction", "arrival_rate", "mode", "dispatch_streams")
PRESETS = ("G_1", "G_n", "G_n-C", "Galaxy")
# Every bench function names the emulated runtime (servingruntime.emulated):
# emulated sandboxes run nothing, but the controller resolves a command.
_RES = common_pb2.Resources(cpu_millis=10, memory_mib=16)


class BenchFileError(ValueError):
    """A malformed bench file; the message names the field."""


@dataclass(frozen=True)
class BenchFile:
    """A parsed bench file."""

    path: Path
    experiment: ex.Experiment
    control_plane: dict[str, Any]
    load: dict[str, Any]
    traces: dict[str, tr.TraceConfig] = field(default_factory=dict)  # by scenario name


def parse(doc: Any, path: Path) -> BenchFile:
    """Validate a YAML document into a BenchFile."""
    if not isinstance(doc, dict):
        raise BenchFileError(f"{path}: must be a mapping with 'scenarios'")
    doc = dict(doc)
    traces: dict[str, tr.TraceConfig] = {}
    scenarios = []
    for i, s in enumerate(doc.get("scenarios") or []):
        rp = s.get("request_profile") if isinstance(s, dict) else None
        if isinstance(rp, dict) and str(rp.get("distribution", "")).lower() == "trace":
            # experiment.parse knows only synthetic distributions: keep the
            # rate (it sets the time compression) and remember the trace.
            s = {**s, "request_profile": {"arrival_rate": rp.get("arrival_rate", 100.0)}}
            try:
                traces[str(s.get("name", f"scenario{i}"))] = tr.TraceConfig.from_dict(rp)
            except (tr.TraceError, TypeError, ValueError) as e:
                raise BenchFileError(f"scenarios[{i}].{e}") from None
        scenarios.append(s)
    doc["scenarios"] = scenarios
    try:
        exp = ex.parse(doc, name=path.stem)
    except ex.ExperimentError as e:
        raise BenchFileError(f"{path}: {e}") from None
    cp = {**CP_DEFAULTS, **_block(doc, "control_plane")}
    cp = {_ALIASES.get(k, k): v for k, v in cp.items()}
    unknown = sorted(set(cp) - set(CP_DEFAULTS))
    if unknown:
        raise BenchFileError(f"control_plane.{unknown[0]}: unknown key")
    load = {**LOAD_DEFAULTS, **_block(doc, "load")}
    unknown = sorted(set(load) - set(LoadSettings.model_fields))
    if unknown:
        raise BenchFileError(f"load.{unknown[0]}: unknown key")
    bf = BenchFile(path, exp, cp, load, traces)
    for plan in exp.plans():  # fail on a bad parameter before starting anything
        control_plane_config(bf, plan.params)
    return bf


def _block(doc: dict[str, Any], key: str) -> dict[str, Any]:
    v = doc.get(key) or {}
    if not isinstance(v, dict):
        raise BenchFileError(f"{key}: must be a mapping")
    return v


def load_file(path: str | Path, quick: bool = False) -> BenchFile:
    """Read and validate a bench file; ``quick``: its short form
    (:mod:`controlplane.bench.quick`)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise BenchFileError(f"cannot read {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise BenchFileError(f"{p}: not valid YAML: {e}") from None
    return parse(shorten(doc) if quick else doc, p)


def control_plane_config(bf: BenchFile, params: dict[str, Any]) -> dict[str, Any]:
    """The control plane a plan runs on: defaults, then preset, then params."""
    cp = dict(bf.control_plane)
    if "n" in params:
        cp["n"] = int(params["n"])
    preset = params.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            raise BenchFileError(f"parameters.preset: one of {', '.join(PRESETS)}, got {preset!r}")
        # DESIGN.md: G_n = n instances of each control function, no caches;
        # -C adds the connection cache; Galaxy adds the probe cache.
        n = 1 if preset == "G_1" else int(cp["n"])
        cp.update(dispatch=n, schedule=n, clustermgr=n)
        cp["connection_cache"] = preset in ("G_n-C", "Galaxy")
        cp["probe_cache"] = preset == "Galaxy"
    for k, v in params.items():
        k = _ALIASES.get(k, k)
        if k in ("preset", "n") or k in LOAD_PARAMS:
            continue
        if k == "instances":
            cp.update(dispatch=int(v), schedule=int(v), clustermgr=int(v))
        elif k == "caches":
            cp.update(connection_cache=bool(v), probe_cache=bool(v))
        elif k in CP_DEFAULTS:
            cp[k] = v
        else:
            known = sorted({*CP_DEFAULTS, *_ALIASES, *LOAD_PARAMS, "instances", "caches", "preset"})
            raise BenchFileError(f"parameters.{k}: unknown (known: {', '.join(known)})")
    for k in ("dispatch", "schedule", "clustermgr", "nodes"):
        if not isinstance(cp[k], int) or cp[k] < 1:
            raise BenchFileError(f"{k}: must be a whole number >= 1, got {cp[k]!r}")
    t0 = cp["gc_threshold0"]
    if t0 is not None and (not isinstance(t0, int) or isinstance(t0, bool) or t0 < 0):
        raise BenchFileError(f"gc_threshold0: a whole number >= 0, got {t0!r}")
    if not (
        cp["state"] in ("memory", "etcd") or str(cp["state"]).startswith(("etcd://", "etcds://"))
    ):
        raise BenchFileError(f"state: memory, etcd or etcd://host:port, got {cp['state']!r}")
    try:
        return ControlPlanePlan(**cp).model_dump()
    except ValidationError as e:
        field, msg = first_error(e)
        raise BenchFileError(f"control_plane.{field}: {msg}") from None


def up_config(cp: dict[str, Any], run_dir: Path, state_url: str) -> UpConfig:
    """UpConfig for a control plane config (emulated sandboxes)."""
    return UpConfig.for_tool(
        dispatch=cp["dispatch"],
        schedule=cp["schedule"],
        clustermgr=cp["clustermgr"],
        nodes=cp["nodes"],
        sandbox="emulated",
        nodes_per_agent=cp["nodes_per_agent"],
        state=state_url,
        run_dir=run_dir,
        connection_cache=bool(cp["connection_cache"]),
        probe_cache=bool(cp["probe_cache"]),
        credits=bool(cp["credits"]),
        agent_streams=bool(cp["agent_streams"]),
        stream_batches=bool(cp["stream_batches"]),
        heartbeat_batches=bool(cp["heartbeat_batches"]),
        node_cpu_millis=cp["node_cpu_millis"],
        node_memory_mib=cp["node_memory_mib"],
        start_delay_ms=cp["start_delay_ms"],
        extra={
            kind: (["--heartbeat-ms", str(int(cp["heartbeat_ms"]))] if kind in _BEATING else [])
            + (_limit_flags(cp) if kind == "controller" else [])
            + _gc_flags(cp)
            for kind in _SERVED
        },
    )


def _limit_flags(cp: dict[str, Any]) -> list[str]:
    """The controller's function limit, when the bench file changes it."""
    n = cp.get("max_functions", validation.MAX_FUNCTIONS_DEFAULT)
    return [] if n == validation.MAX_FUNCTIONS_DEFAULT else ["--max-functions", str(n)]


def _gc_flags(cp: dict[str, Any]) -> list[str]:
    """The garbage-collector flags of every served process (``GcConfig``)."""
    if not cp["gc_tuning"]:
        return ["--no-gc-freeze", "--gc-threshold0", "0"]
    t0 = cp["gc_threshold0"]
    return [] if t0 is None else ["--gc-threshold0", str(t0)]


# The kinds `galaxy up` serves, and those that take --heartbeat-ms.
_SERVED = ("controller", "dispatch", "schedule", "clustermgr", "nodeagent")
_BEATING = ("clustermgr", "nodeagent")


def load_settings(bf: BenchFile, plan: ex.Plan) -> LoadSettings:
    """Resolve a plan's load settings."""
    sc = plan.scenario
    x = {**bf.load, **sc.extra}
    bad = sorted(set(sc.extra) - set(LoadSettings.model_fields))
    if bad:
        raise BenchFileError(f"scenario {sc.name}: unknown key {bad[0]!r}")
    rate_of = None
    if "rate_of" in x:
        ro = x["rate_of"]
        if not isinstance(ro, dict) or "scenario" not in ro:
            raise BenchFileError(f"scenario {sc.name}.rate_of: needs 'scenario' and 'fraction'")
        rate_of = (str(ro["scenario"]), float(ro.get("fraction", 0.5)))
    values = {k: v for k, v in x.items() if k != "rate_of"}
    values.update(
        cold_fraction=sc.cold_fraction, arrival_rate=sc.profile.arrival_rate, rate_of=rate_of
    )
    values.update({k: plan.params[k] for k in LOAD_PARAMS if k in plan.params})
    try:
        s = LoadSettings(**values)
    except ValidationError as e:
        field, msg = first_error(e)
        raise BenchFileError(f"scenario {sc.name}.{field}: {msg}") from None
    if s.mode not in ("open", "closed"):
        raise BenchFileError(f"scenario {sc.name}.mode: open or closed, got {s.mode!r}")
    return s


@dataclass
class Workload:
    """What the load generator runs for one plan."""

    functions: list[common_pb2.FunctionSpec]
    # (intended send time s, function index, hold ms: 0 = release at once,
    # > 0 = hold that long, -1 = hold until the plan ends)
    requests: list[tuple[float, int, float]]
    prime: list[tuple[int, float]]  # (function index, hold ms) before everything
    warmup: int
    note: str = ""


#: Instances a benchmark function may have: the cluster's default bound
#: (controller --max-instances-per-function), far above any plan's concurrency.
MAX_SCALE = validation.MAX_INSTANCES_PER_FUNCTION_DEFAULT


def _spec(name: str, concurrency: int, max_scale: int) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(
        name=name,
        runtime=servingruntime.emulated().name,
        resources=_RES,
        concurrency=concurrency,
        max_scale=max_scale,
        startup_timeout_ms=10_000,
    )


def build_workload(
    bf: BenchFile, plan: ex.Plan, s: LoadSettings, prefix: str, data_dir: Path
) -> Workload:
    """Functions and the request schedule of a plan.

    A cold request targets a function of the cold pool (concurrency 1) and
    keeps its lease until the plan ends, as a long-running request would, so
    every later request to that function finds no free instance and must
    cold-start one. Warm requests go to warm functions (high concurrency,
    primed with one instance each) and release at once.
    """
    sc = plan.scenario
    seed = int(bf.load["seed"])
    profile = replace(sc.profile, arrival_rate=s.arrival_rate)
    if sc.name in bf.traces:
        rep = tr.load(data_dir, bf.traces[sc.name], sc.total_requests, s.arrival_rate, seed)
        fns = [_spec(f"{prefix}-t-{i}", 1, MAX_SCALE) for i in range(len(rep.function_ids))]
        note = f"trace {bf.traces[sc.name].sample}, time compressed {rep.compression:.0f}x"
        return Workload(fns, rep.requests, [], sc.warmup_requests, note)
    times = profile.arrivals(sc.total_requests, seed)
    rng = random.Random(seed + 1)
    cold = [rng.random() < s.cold_fraction for _ in times]
    n_cold = max(1, min(s.cold_functions, sum(cold)))
    n_warm = max(1, s.warm_functions)
    fns = [_spec(f"{prefix}-w-{i}", s.warm_concurrency, 4) for i in range(n_warm)]
    fns += [_spec(f"{prefix}-c-{i}", 1, MAX_SCALE) for i in range(n_cold)]
    reqs: list[tuple[float, int, float]] = []
    k = 0
    for t, c in zip(times, cold, strict=True):
        if c:
            reqs.append((t, n_warm + k % n_cold, -1.0))
            k += 1
        else:
            reqs.append((t, rng.randrange(n_warm), s.warm_hold_ms))
    prime: list[tuple[int, float]] = []
    if not all(cold):
        prime += [(i, 0.0) for i in range(n_warm)]
    if any(cold):
        prime += [(n_warm + i, -1.0) for i in range(n_cold)]
    return Workload(fns, reqs, prime, sc.warmup_requests)
