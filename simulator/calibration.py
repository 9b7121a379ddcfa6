"""Per-operation service times of the control functions (the calibration).

A calibration file is JSON:

    {"machine": "...", "measured_at": "...", "method": "...",
     "ops": {"dispatch.dispatch": {"mean_s": 1.4e-4, "cv": 0.3, "source": "..."}, ...},
     "params": {"connect_s": {"value": 0.0015, "source": "..."}, ...}}

``ops`` are CPU time per operation of one process (a station in the
simulator); ``params`` are other measured constants (connection setup, the
loopback one-way delay, the time to start a control function instance).
``galaxy simulate-calibrate`` measures them on this machine (see
``simulator.calibrate``); ``simulator/data/calibration.json`` ships the
values measured on the reference machine. Every entry says where it came
from.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

#: The operations every Galaxy model charges, with what each one covers.
OPS: dict[str, str] = {
    "dispatch.dispatch": "a Dispatch request handled by a Dispatch instance (acquire + reply), "
    "its stream's read and write its own (a client at a modest rate)",
    "dispatch.release": "Release RPC handled by a Dispatch instance",
    "dispatch.scale_up": "a Schedule RPC made by Dispatch and its reply handled",
    "schedule.schedule": "Schedule RPC handled by a Schedule instance (less schedule.decide)",
    "schedule.decide": "PlacementPolicy begin/advance/confirm of one placement (pure Python)",
    "dispatch.credit_take": "CreditWallet.take of a credit start on Dispatch (pure Python; "
    "the span Dispatch's scheduling latency times)",
    "schedule.probe": "one Probe RPC made by Schedule and its answer recorded",
    "schedule.create": "one CreateInstance RPC made by Schedule",
    "schedule.modnodes": "ModNodes RPC handled by a Schedule instance (its statuses excepted)",
    "schedule.upsert": "one status of a ModNodes RPC handled by Schedule (PlacementPolicy.upsert)",
    "agent.probe": "Probe RPC handled by a node agent",
    "agent.create": "CreateInstance handled by a node agent (sandbox start excluded)",
    "agent.delete": "DeleteInstance handled by a node agent",
    "agent.heartbeat": "a heartbeat sent by a node agent",
    "clustermgr.update": "heartbeat (or RegisterNode) handled by ClusterMgr",
    "clustermgr.modnodes": "one ModNodes RPC made by ClusterMgr's outbox (client side)",
    "dispatch.message": "Dispatch's own work for a request on a DispatchStream (the "
    "stream's reads and writes excepted)",
    "dispatch.credit_create": "Dispatch's own work for a credit start's CreateInstance "
    "message and its answer (stream writes and reads excepted)",
    "dispatch.stream_write": "one write, or read, of a batch on a stream by Dispatch",
    "agent.stream_create": "a CreateInstance message handled by a node agent on its "
    "InstanceStream (stream writes and reads and the sandbox start excepted)",
    "agent.stream_write": "one write, or read, of a batch on a stream by a node agent",
    "client.rpc": "one unary RPC made by a Python gRPC client (the load generator)",
}

Sampler = Callable[[], float]


class CalibrationError(ValueError):
    """A malformed calibration file; the message names the entry."""


@dataclass(frozen=True)
class OpCost:
    """Service time of one operation: mean and coefficient of variation."""

    mean_s: float
    cv: float = 0.0
    source: str = ""
    #: a measured distribution (evenly spaced quantiles, mean 1) used in
    #: place of the gamma of ``cv``: short work whose tail is the machine's
    #: (interrupts, a cold cache after a wake), not the work's own variance
    shape: tuple[float, ...] = ()


@dataclass
class Calibration:
    """A loaded calibration; ``sampler(op, rng)`` draws service times."""

    ops: dict[str, OpCost]
    params: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def mean(self, op: str) -> float:
        """Mean service time of op (KeyError names the missing op)."""
        try:
            return self.ops[op].mean_s
        except KeyError:
            raise KeyError(f"calibration has no op {op!r}") from None

    def param(self, name: str, default: float | None = None) -> float:
        """A measured constant (or default when given and absent)."""
        if name in self.params:
            return self.params[name]
        if default is None:
            raise KeyError(f"calibration has no param {name!r}")
        return default

    def sampler(self, op: str, rng: random.Random, scale: float = 1.0) -> Sampler:
        """A function drawing service times of op: constant when cv is 0,
        else gamma-distributed with the op's mean and cv (times scale).

        Gamma draws are slow in pure Python and this is on the simulator's
        hot path, so a sampler picks uniformly from a fixed table of 4,096
        gamma draws (rescaled to the exact mean).
        """
        c = self.ops.get(op)
        if c is None:
            raise KeyError(f"calibration has no op {op!r}")
        mean = c.mean_s * scale
        pause_p, pause_s = self.params.get("pause_p", 0.0), self.params.get("pause_s", 0.0)
        if c.cv <= 0 and not c.shape and not pause_p:
            return lambda: mean
        # (not ``(1.0,) * 4096``: mypy types that as a tuple of 4,096 floats,
        # which the optional compiled build would unroll into 150 MB of C)
        if c.shape:
            table = _shape_table(c.shape)
        else:
            table = _gamma_table(c.cv) if c.cv > 0 else tuple([1.0] * 4096)
        scaled = [mean * x for x in table]
        bits = rng.getrandbits
        if not (pause_p and pause_s):
            return lambda: scaled[bits(12)]
        # Now and then a process stalls (a garbage collection, a lost CPU):
        # pause_p of its operations take pause_s longer.
        rand = rng.random
        return lambda: scaled[bits(12)] + (pause_s if rand() < pause_p else 0.0)

    def scaled(self, factor: float | Mapping[str, float]) -> Calibration:
        """Every op's mean multiplied by factor (a slower/faster machine); a
        mapping scales the ops of each process by its own factor, keyed by
        the op name's prefix (``{"schedule": 1.2}`` scales ``schedule.*``;
        ops of other prefixes are kept)."""

        def f(op: str) -> float:
            if isinstance(factor, Mapping):
                return factor.get(op.split(".", 1)[0], 1.0)
            return factor

        ops = {k: OpCost(v.mean_s * f(k), v.cv, v.source, v.shape) for k, v in self.ops.items()}
        return Calibration(ops, dict(self.params), dict(self.meta), dict(self.sources))

    def to_json(self) -> dict[str, Any]:
        """The file form."""
        return {
            **self.meta,
            "ops": {
                k: {"mean_s": v.mean_s, "cv": v.cv, "source": v.source}
                | ({"shape": list(v.shape)} if v.shape else {})
                for k, v in sorted(self.ops.items())
            },
            "params": {
                k: {"value": v, "source": self.sources.get(k, "")}
                for k, v in sorted(self.params.items())
            },
        }


@functools.lru_cache(maxsize=64)
def _gamma_table(cv: float) -> tuple[float, ...]:
    """4,096 draws of a gamma distribution with the given coefficient of
    variation, from a fixed seed, rescaled to mean exactly 1."""
    k = 1.0 / (cv * cv)
    r = random.Random(4096)
    xs = [r.gammavariate(k, 1.0 / k) for _ in range(4096)]
    m = sum(xs) / len(xs)
    return tuple(x / m for x in xs)


@functools.lru_cache(maxsize=16)
def _shape_table(shape: tuple[float, ...]) -> tuple[float, ...]:
    """4,096 draws spread evenly over a measured shape's quantiles, mean 1."""
    n = len(shape)
    xs = [shape[i * n // 4096] for i in range(4096)]
    m = sum(xs) / len(xs)
    return tuple(x / m for x in xs)


#: Points a measured shape may have.
MAX_SHAPE_POINTS = 1000


def _shape(v: Any, where: str) -> tuple[float, ...]:
    if v is None:
        return ()
    if (
        not isinstance(v, list)
        or not 0 < len(v) <= MAX_SHAPE_POINTS
        or not all(isinstance(x, int | float) and x > 0 for x in v)
    ):
        raise CalibrationError(
            f"{where}.shape must be a list of 1 to {MAX_SHAPE_POINTS} numbers > 0"
        )
    return tuple(sorted(float(x) for x in v))


def parse(doc: Any, name: str = "calibration") -> Calibration:
    """Validate a parsed JSON document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ops"), dict):
        raise CalibrationError(f"{name}: must be an object with 'ops'")
    ops: dict[str, OpCost] = {}
    for k, v in doc["ops"].items():
        if not isinstance(v, dict) or not isinstance(v.get("mean_s"), int | float):
            raise CalibrationError(f"{name}: ops.{k}.mean_s must be a number")
        if v["mean_s"] < 0 or v.get("cv", 0) < 0:
            raise CalibrationError(f"{name}: ops.{k}: mean_s and cv must be >= 0")
        ops[k] = OpCost(float(v["mean_s"]), float(v.get("cv", 0.0)), str(v.get("source", "")),
                        _shape(v.get("shape"), f"{name}: ops.{k}"))  # fmt: skip
    missing = sorted(set(OPS) - set(ops))
    if missing:
        raise CalibrationError(f"{name}: ops missing: {', '.join(missing)}")
    params: dict[str, float] = {}
    sources: dict[str, str] = {}
    for k, v in (doc.get("params") or {}).items():
        if not isinstance(v, dict) or not isinstance(v.get("value"), int | float):
            raise CalibrationError(f"{name}: params.{k}.value must be a number")
        params[k] = float(v["value"])
        sources[k] = str(v.get("source", ""))
    meta = {k: v for k, v in doc.items() if k not in ("ops", "params")}
    return Calibration(ops, params, meta, sources)


def load(path: str | Path | None = None) -> Calibration:
    """A calibration file, or the default one shipped with the package."""
    if path is None:
        text = resources.files("simulator").joinpath("data/calibration.json").read_text()
        return parse(json.loads(text), "default calibration")
    p = Path(path)
    try:
        return parse(json.loads(p.read_text()), str(p))
    except OSError as e:
        raise CalibrationError(f"cannot read {p}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{p}: not valid JSON: {e}") from None
