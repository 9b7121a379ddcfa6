"""The simulator's command-line settings, one typed class per command
(``galaxy simulate``, ``simulate-fidelity``, ``simulate-calibrate``): the
one place their defaults live; ``simulator.cli`` derives the flags.

Light on purpose (pydantic only): the CLI builds its parser from these
without importing numpy, so a missing extra is reported when a command
runs, not when `galaxy` starts.
"""

from __future__ import annotations

from controlplane.runtime.config import Config, same_as, setting
from functions.dispatch.autoscaling.settings import DEFAULTS as AUTOSCALE_DEFAULTS

#: The simulated cluster's size when none is given (the paper's: DESIGN.md);
#: ``SimConfig.nodes`` reads it too.
DEFAULT_NODES = 210
#: Every system ``galaxy simulate`` compares by default.
DEFAULT_SYSTEMS = "galaxy,knative,sparrow,ray,atoll"
#: Real runs of a fidelity check or a calibration; each median is kept.
DEFAULT_REPEAT = 3


class SimulateConfig(Config):
    """``galaxy simulate``."""

    nodes: int = setting(DEFAULT_NODES, "worker nodes", ge=1)
    workload: str | None = setting(
        None,
        "azure2019[:minutes=N] (the shipped sample), DIR[:minutes=N] (a folder of "
        "Azure 2019 trace files, e.g. a full day), azure2021, llm2023, "
        "poisson:rate=R,duration=S, gamma:rate=R,shape=K, bursty:duration=S, "
        "or an experiment file (.yaml)",
    )
    systems: str = setting(
        DEFAULT_SYSTEMS, "comma list of galaxy, G1, Gn, Gn-C, knative, sparrow, ray, atoll"
    )
    experiment: str | None = setting(
        None,
        "run a documented experiment: overall, scalability, ablation, cluster-size, sensitivity",
    )
    quick: bool = setting(False, "a smaller version of --experiment")
    out: str = setting(..., "directory for report.md, results.json, PNGs")
    network: str = setting("datacenter", "datacenter (default) or loopback")
    keep_alive: float = setting(
        AUTOSCALE_DEFAULTS.keepalive_s, "fixed keep-alive seconds (0: KPA grace)", ge=0
    )
    until: float | None = setting(None, "stop at this simulated time (s)")
    no_progress: bool = setting(False, "no progress bar")
    seed: int = setting(1, "seed of every random stream")
    calibration: str | None = setting(None, "calibration JSON (default: the shipped one)")
    models: str | None = setting(
        None,
        "give each function a model: 'mixed' (sizes: simulator/models.py); node caches, "
        "fetches over each node's link, Schedule scoring model_locality",
    )
    model_locality: bool = setting(
        True, "ablation with --models: Schedule scores least_loaded", flag="--no-model-locality"
    )


class FidelityConfig(Config):
    """``galaxy simulate-fidelity``: one scenario simulated and on a real
    emulated cluster, compared."""

    nodes: int = same_as(SimulateConfig, "nodes")
    out: str = setting(..., "directory for fidelity.json and report.md")
    real: str | None = setting(
        None, "reuse a real-cluster result (fidelity.json) instead of starting a cluster"
    )
    quick: bool = setting(
        False,
        "a smoke test of the command: fewer requests, one real run, the shipped "
        "calibration (too few samples to judge p99)",
    )
    repeat: int | None = setting(
        None,
        f"real runs; each metric's median sim/real ratio is judged "
        f"(default {DEFAULT_REPEAT}; --quick: 1)",
        ge=1,
    )
    credits: bool = setting(
        True,
        "capacity credits on both sides (production's default; --no-credits: "
        "the Schedule path only)",
    )
    seed: int = same_as(SimulateConfig, "seed")
    calibration: str | None = setting(
        None,
        "'measure' (default without --quick: calibrate on this machine just before "
        "the real run), "
        "'shipped' (the calibration shipped with the package), or a calibration JSON",
    )


class SimCalibrateConfig(Config):
    """``galaxy simulate-calibrate``: the simulator's per-operation service
    times, measured against the real services."""

    out: str = setting(..., "calibration JSON to write")
    nodes: int = same_as(SimulateConfig, "nodes")
    quick: bool = setting(False, "fewer requests (less precise)")
    repeat: int = setting(DEFAULT_REPEAT, "bench runs; each op's median is kept", ge=1)
