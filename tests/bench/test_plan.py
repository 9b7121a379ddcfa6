"""Bench files: configs from parameters, request schedules, trace replay."""

from pathlib import Path

import pytest
import yaml

from controlplane.bench import batching as batching_bench
from controlplane.bench import llm as llm_bench
from controlplane.bench import models as models_bench
from controlplane.bench import plan as pl
from controlplane.bench import trace as tr

REPO = Path(__file__).resolve().parents[2]


def doc(**over):
    d = {
        "control_plane": {"nodes": 8},
        "load": {"seed": 3},
        "parameters": [{"name": "preset", "value": ["G_1", "G_n", "G_n-C", "Galaxy"]}],
        "scenarios": [
            {
                "name": "mixed",
                "total_requests": 400,
                "warmup_requests": 40,
                "cold_fraction": 0.25,
                "cold_functions": 10,
                "request_profile": {"distribution": "Poisson", "arrival_rate": 100},
            }
        ],
    }
    d.update(over)
    return d


def test_presets_follow_the_design_ablation():
    bf = pl.parse(doc(), Path("x.yaml"))
    cfgs = [pl.control_plane_config(bf, p.params) for p in bf.experiment.plans()]
    got = [(c["dispatch"], c["connection_cache"], c["probe_cache"]) for c in cfgs]
    assert got == [(1, False, False), (2, False, False), (2, True, False), (2, True, True)]
    assert all(c["nodes"] == 8 for c in cfgs)


def test_aliases_groups_and_load_overrides():
    d = doc(
        parameters=[
            {"name": "schedule_instances", "value": [3]},
            {"name": "caches", "value": [False]},
            {"name": "concurrency", "value": [4]},
        ]
    )
    bf = pl.parse(d, Path("x.yaml"))
    plan = next(bf.experiment.plans())
    cp = pl.control_plane_config(bf, plan.params)
    assert (cp["schedule"], cp["connection_cache"], cp["probe_cache"]) == (3, False, False)
    assert pl.load_settings(bf, plan).concurrency == 4
    up = pl.up_config(cp, Path("/tmp/x"), "memory://")
    assert up.sandbox == "emulated" and up.schedule == 3 and not up.probe_cache
    assert up.extra["nodeagent"] == ["--heartbeat-ms", "1000"]
    assert up.extra["dispatch"] == []  # the garbage collector is tuned by default


def test_gc_tuning_off_reaches_every_process():
    bf = pl.parse(doc(control_plane={"gc_tuning": False}), Path("x.yaml"))
    cp = pl.control_plane_config(bf, next(bf.experiment.plans()).params)
    up = pl.up_config(cp, Path("/tmp/x"), "memory://")
    off = ["--no-gc-freeze", "--gc-threshold0", "0"]
    assert up.extra["clustermgr"] == ["--heartbeat-ms", "1000", *off]
    assert all(up.extra[k] == off for k in ("controller", "dispatch", "schedule"))


def test_gc_threshold_sweep():
    bf = pl.parse(doc(parameters=[{"name": "gc_threshold0", "value": [700]}]), Path("x.yaml"))
    cp = pl.control_plane_config(bf, next(bf.experiment.plans()).params)
    assert pl.up_config(cp, Path("/tmp/x"), "memory://").extra["dispatch"] == [
        "--gc-threshold0",
        "700",
    ]
    with pytest.raises(pl.BenchFileError, match="gc_threshold0"):
        pl.parse(doc(control_plane={"gc_threshold0": -5}), Path("x.yaml"))


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"parameters": [{"name": "bogus", "value": [1]}]}, "parameters.bogus"),
        ({"parameters": [{"name": "preset", "value": ["G_2"]}]}, "preset"),
        ({"control_plane": {"nodez": 3}}, "control_plane.nodez"),
        ({"control_plane": {"state": "redis"}}, "state"),
        ({"scenarios": []}, "scenarios"),
    ],
)
def test_bad_files_name_the_field(over, match):
    with pytest.raises(pl.BenchFileError, match=match):
        pl.parse(doc(**over), Path("x.yaml"))


def test_workload_cold_requests_hold_their_lease_and_warm_ones_release():
    bf = pl.parse(doc(parameters=[]), Path("x.yaml"))
    plan = next(bf.experiment.plans())
    s = pl.load_settings(bf, plan)
    wl = pl.build_workload(bf, plan, s, "p0-0", Path("/nonexistent"))
    assert len(wl.requests) == 400 and wl.warmup == 40
    n_warm = s.warm_functions
    cold = [r for r in wl.requests if r[1] >= n_warm]
    assert all(h == -1.0 for _, _, h in cold)
    assert all(h == 0.0 for _, f, h in wl.requests if f < n_warm)
    assert 60 < len(cold) < 140  # ~25% of 400, seeded
    names = [f.name for f in wl.functions]
    assert len(names) == n_warm + 10 and len(set(names)) == len(names)
    assert all(f.runtime == "emulated" and f.concurrency for f in wl.functions)
    # Every function used is primed once, cold ones keep the lease.
    assert sorted(f for f, _ in wl.prime) == list(range(len(names)))
    times = [t for t, _, _ in wl.requests]
    assert times == sorted(times)


def test_every_bundled_experiment_parses():
    files = sorted((REPO / "experiments").glob("*.yaml"))
    names = {f.stem for f in files}
    assert {"smoke", "warm-dispatch", "cold-burst", "ablation", "azure-replay"} <= names
    assert "etcd-vs-memory" in names
    for f in files:
        doc = yaml.safe_load(f.read_text())
        if doc.get("kind") == "llm":  # the LLM bench's own format
            assert llm_bench.load_file(str(f)).plans
            continue
        if doc.get("kind") == models_bench.PLAN_KIND:  # the model cold-start plan
            assert models_bench.load_plan(doc) is not None
            continue
        if doc.get("kind") == batching_bench.PLAN_KIND:  # the batching plan
            assert batching_bench.load_plan(doc) is not None
            continue
        bf = pl.load_file(f)
        for p in bf.experiment.plans():
            pl.load_settings(bf, p)


def _trace(tmp_path: Path) -> Path:
    d = tmp_path / "sample"
    d.mkdir()
    rows = ["HashOwner,HashApp,HashFunction,Trigger,0,1,2"]
    rows += ["o,a,f1,http,10,20,30", "o,a,f2,http,1,0,2", "o,a,f3,http,0,0,0"]
    (d / "invocations.csv").write_text("\n".join(rows) + "\n")
    (d / "durations.csv").write_text("HashOwner,HashApp,HashFunction,Average\no,a,f1,600\n")
    return d


def test_trace_replay_compresses_time_and_holds(tmp_path):
    _trace(tmp_path)
    cfg = tr.TraceConfig(sample="sample", minutes=3, functions=5)
    # 63 invocations in 180 s = 0.35/s; asked for 35/s: 100x faster.
    rep = tr.load(tmp_path, cfg, 60, 35.0, seed=1)
    assert rep.compression == pytest.approx(100.0)
    assert rep.function_ids == ["f1", "f2"]  # the silent one is dropped
    assert len(rep.requests) == 60 and rep.requests[-1][0] <= 1.8
    assert {h for _, f, h in rep.requests if f == 0} == {6.0}  # 600 ms / 100
    assert {h for _, f, h in rep.requests if f == 1} == {0.0}  # no duration known
    with pytest.raises(tr.TraceError, match="fewer than total_requests"):
        tr.load(tmp_path, cfg, 1000, 35.0, seed=1)
    with pytest.raises(tr.TraceError, match="exceeds"):
        tr.load(tmp_path, tr.TraceConfig(sample="sample", minutes=9), 10, 1.0, seed=1)


def test_trace_scenario_in_a_bench_file(tmp_path):
    _trace(tmp_path)
    d = doc(parameters=[])
    d["scenarios"] = [
        {
            "name": "az",
            "total_requests": 50,
            "request_profile": {"distribution": "trace", "sample": "sample", "minutes": 3},
        }
    ]
    bf = pl.parse(d, Path("x.yaml"))
    plan = next(bf.experiment.plans())
    wl = pl.build_workload(bf, plan, pl.load_settings(bf, plan), "p0-0", tmp_path)
    assert len(wl.requests) == 50 and len(wl.functions) == 2 and "trace" in wl.note
    d["scenarios"][0]["request_profile"]["speed"] = 3
    with pytest.raises(pl.BenchFileError, match="speed"):
        pl.parse(d, Path("x.yaml"))
