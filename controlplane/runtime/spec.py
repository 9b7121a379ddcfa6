"""Function specs: YAML -> FunctionSpec proto, and validation with messages
that name the offending field. Used by the CLI (before sending) and by the
controller (authoritative: it never stores an invalid spec).

A spec names a serving runtime and gives an artifact and args; the command
is the runtime's (``servingruntime``), so a YAML spec has no ``command`` or
``workdir``. Fields a spec leaves out stay 0 here, so that the runtime's
defaults and then the cluster's (``with_defaults``) apply on the controller.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from controlplane.runtime import models, servingruntime, validation
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.validation import NAME_RE, key, short
from galaxy.v1 import common_pb2

__all__ = ["NAME_RE", "from_dict", "load_file", "validate", "with_defaults"]
# Defaults a user would expect from a serverless platform.
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_SCALE = 10
DEFAULT_CPU_MILLIS = 100
DEFAULT_MEMORY_MIB = 128
DEFAULT_STARTUP_TIMEOUT_MS = 30_000
MAX_STARTUP_TIMEOUT_MS = validation.STARTUP_TIMEOUT_MS_MAX

_TOP_FIELDS = {
    "name",
    "namespace",
    "public",
    "egress",
    "runtime",
    "artifact",
    "args",
    "env",
    "resources",
    "concurrency",
    "min_scale",
    "max_scale",
    "readiness_path",
    "startup_timeout_ms",
    "request_timeout_ms",
    "autoscaling",
    "model",
    "batching",
    "pd",
}
_RES_FIELDS = {"cpu_millis", "memory_mib", "gpus", "disk_mib"}
_AUTOSCALING_INT = {
    "stable_window_ms", "scale_to_zero_grace_ms", "keepalive_ms", "ttft_ms", "tpot_ms",
    "max_asleep", "keep_asleep_ms",
}  # fmt: skip
_AUTOSCALING_FLOAT = {"target_utilization", "panic_window_percent", "target"}
_AUTOSCALING_STR = {"keepalive", "metric"}
_AUTOSCALING_FIELDS = _AUTOSCALING_INT | _AUTOSCALING_FLOAT | _AUTOSCALING_STR


def _int(doc: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    """doc[key] within [lo, hi]; default (unchecked: 0 means "unset") when absent."""
    if key not in doc:
        return default
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgument(f"{path}: must be an integer, got {short(v)}")
    if not lo <= v <= hi:
        raise InvalidArgument(f"{path}: must be between {lo} and {hi}, got {v}")
    return v


def _strings(doc: dict[str, Any], key: str, example: str) -> list[str]:
    v = doc.get(key, []) or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InvalidArgument(f"{key}: must be a list of strings, e.g. {example}")
    return v


def from_dict(doc: Any, base_dir: Path | None = None) -> common_pb2.FunctionSpec:
    """Build a FunctionSpec from a parsed YAML/JSON document.

    base_dir resolves a relative ``artifact`` path (the spec file's
    directory), so specs in the repo work from any current directory.
    Raises InvalidArgument naming the field on any problem.
    """
    if not isinstance(doc, dict):
        raise InvalidArgument("spec: must be a mapping with at least 'name' and 'runtime'")
    for field in ("command", "workdir"):
        if field in doc:
            raise InvalidArgument(
                f"{field}: set by the runtime; name a runtime instead "
                '(`galaxy runtimes list`; docs/security.md, "Serving runtimes")'
            )
    unknown = sorted((str(k) for k in set(doc) - _TOP_FIELDS), key=str)
    if unknown:
        raise InvalidArgument(
            f"{key(unknown[0])}: unknown field (allowed: {', '.join(sorted(_TOP_FIELDS))})"
        )
    spec = common_pb2.FunctionSpec()
    name = doc.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("name: required string")
    spec.name = name
    namespace = doc.get("namespace", "")
    if not isinstance(namespace, str):
        raise InvalidArgument("namespace: must be a string (a DNS-1123 label)")
    spec.namespace = namespace
    public = doc.get("public", False)
    if not isinstance(public, bool):
        raise InvalidArgument("public: must be true or false")
    spec.public = public
    egress = doc.get("egress", False)
    if not isinstance(egress, bool):
        raise InvalidArgument("egress: must be true or false")
    spec.egress = egress
    runtime = doc.get("runtime")
    if not isinstance(runtime, str):
        raise InvalidArgument("runtime: required string, the name of a serving runtime")
    spec.runtime = runtime
    artifact = doc.get("artifact", "")
    if not isinstance(artifact, str):
        raise InvalidArgument("artifact: must be a string (a path or a URI)")
    if artifact and base_dir is not None and not _absolute_or_uri(artifact):
        artifact = str((base_dir / artifact).resolve())
    spec.artifact = artifact
    spec.args.extend(_strings(doc, "args", "[--model-name=m]"))
    env = doc.get("env", {}) or {}
    if not isinstance(env, dict):
        raise InvalidArgument("env: must be a mapping of NAME: value")
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str | int | float):
            raise InvalidArgument(f"env.{key(k)}: keys and values must be strings")
        spec.env[k] = str(v)
    if doc.get("resources") is not None:  # left out: the runtime's, else the cluster's
        _resources(doc["resources"], spec.resources)
    spec.concurrency = _int(doc, "concurrency", "concurrency", 0, 1, validation.CONCURRENCY_MAX)
    spec.min_scale = _int(doc, "min_scale", "min_scale", 0, 0, validation.SCALE_MAX)
    spec.max_scale = _int(doc, "max_scale", "max_scale", DEFAULT_MAX_SCALE, 1, validation.SCALE_MAX)
    rp = doc.get("readiness_path", "")
    if not isinstance(rp, str):
        raise InvalidArgument("readiness_path: must be a string like /healthz")
    spec.readiness_path = rp
    spec.startup_timeout_ms = _int(
        doc, "startup_timeout_ms", "startup_timeout_ms", 0, 1, MAX_STARTUP_TIMEOUT_MS
    )
    spec.request_timeout_ms = _int(
        doc, "request_timeout_ms", "request_timeout_ms", 0, 0, validation.REQUEST_TIMEOUT_MS_MAX
    )
    _autoscaling(doc.get("autoscaling") or {}, spec.autoscaling)
    if doc.get("model") is not None:
        spec.model.CopyFrom(models.from_dict(doc["model"], base_dir))
    if doc.get("batching") is not None:
        _batching(doc["batching"], spec.batching)
    if doc.get("pd") is not None:
        _pd(doc["pd"], spec.pd)
    servingruntime.check_request(spec)
    return spec


def _batching(doc: Any, out: common_pb2.BatchingSpec) -> None:
    """The ``batching`` mapping (both fields required; ranges by ``validate``)."""
    if not isinstance(doc, dict):
        raise InvalidArgument("batching: must be a mapping (max_batch_size, max_latency_ms)")
    bad = sorted(str(k) for k in set(doc) - {"max_batch_size", "max_latency_ms"})
    if bad:
        raise InvalidArgument(
            f"batching.{key(bad[0])}: unknown field (allowed: max_batch_size, max_latency_ms)"
        )
    out.max_batch_size = _int(doc, "max_batch_size", "batching.max_batch_size", 0, 2,
                              validation.BATCH_SIZE_MAX)  # fmt: skip
    out.max_latency_ms = _int(doc, "max_latency_ms", "batching.max_latency_ms", 0, 1,
                              validation.BATCH_LATENCY_MS_MAX)  # fmt: skip
    for f in ("max_batch_size", "max_latency_ms"):
        if f not in doc:
            raise InvalidArgument(f"batching.{f}: required")


def _pd(doc: Any, out: common_pb2.PdSpec) -> None:
    """The ``pd`` mapping (prefill/decode disaggregation; ranges by ``validate``)."""
    if not isinstance(doc, dict):
        raise InvalidArgument("pd: must be a mapping (prefill, kv_bytes_per_token, prefill_tps)")
    bad = sorted(str(k) for k in set(doc) - {"prefill", "kv_bytes_per_token", "prefill_tps"})
    if bad:
        raise InvalidArgument(
            f"pd.{key(bad[0])}: unknown field (allowed: prefill, kv_bytes_per_token, prefill_tps)"
        )
    prefill = doc.get("prefill")
    if not isinstance(prefill, str) or not prefill:
        raise InvalidArgument("pd.prefill: required, the name of the prefill function")
    out.prefill = prefill
    out.kv_bytes_per_token = _int(
        doc, "kv_bytes_per_token", "pd.kv_bytes_per_token", 0, 0, validation.KV_BYTES_PER_TOKEN_MAX
    )
    tps = doc.get("prefill_tps", 0)
    if isinstance(tps, bool) or not isinstance(tps, int | float):
        raise InvalidArgument(f"pd.prefill_tps: must be a number, got {short(tps)}")
    out.prefill_tps = float(tps)


def _absolute_or_uri(artifact: str) -> bool:
    return os.path.isabs(artifact) or "://" in artifact


def _resources(res: Any, out: common_pb2.Resources) -> None:
    """A resources block: keys left out get the cluster's defaults (as before
    runtimes: a block is taken as the whole request)."""
    if not isinstance(res, dict):
        raise InvalidArgument(
            "resources: must be a mapping (cpu_millis, memory_mib, gpus, disk_mib)"
        )
    bad = sorted(str(k) for k in set(res) - _RES_FIELDS)
    if bad:
        raise InvalidArgument(
            f"resources.{key(bad[0])}: unknown field "
            "(allowed: cpu_millis, memory_mib, gpus, disk_mib)"
        )
    out.cpu_millis = _int(
        res, "cpu_millis", "resources.cpu_millis", DEFAULT_CPU_MILLIS, 0, validation.CPU_MILLIS_MAX
    )
    out.memory_mib = _int(
        res, "memory_mib", "resources.memory_mib", DEFAULT_MEMORY_MIB, 0, validation.MEMORY_MIB_MAX
    )
    out.gpus = _int(res, "gpus", "resources.gpus", 0, 0, validation.GPUS_MAX)
    # 0: the node agent's default (--instance-disk-mib).
    out.disk_mib = _int(res, "disk_mib", "resources.disk_mib", 0, 0, validation.DISK_MIB_MAX)


def _autoscaling(doc: Any, out: common_pb2.AutoscalingSpec) -> None:
    """The ``autoscaling`` mapping; ranges are checked by ``validate``."""
    if not isinstance(doc, dict):
        raise InvalidArgument("autoscaling: must be a mapping (see docs/autoscaling.md)")
    bad = sorted(str(k) for k in set(doc) - _AUTOSCALING_FIELDS)
    if bad:
        raise InvalidArgument(
            f"autoscaling.{key(bad[0])}: unknown field "
            f"(allowed: {', '.join(sorted(_AUTOSCALING_FIELDS))})"
        )
    for name in sorted(_AUTOSCALING_INT & set(doc)):
        setattr(out, name, _int(doc, name, f"autoscaling.{name}", 0, 0, 2**32 - 1))
    for name in sorted(_AUTOSCALING_FLOAT & set(doc)):
        v = doc[name]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InvalidArgument(f"autoscaling.{name}: must be a number, got {short(v)}")
        setattr(out, name, float(v))
    for name in sorted(_AUTOSCALING_STR):
        v = doc.get(name, "")
        if not isinstance(v, str):
            raise InvalidArgument(f"autoscaling.{name}: must be a string, got {short(v)}")
        setattr(out, name, v)


def read_yaml(path: str | Path, what: str) -> Any:
    """The parsed YAML document of a file (what: "spec", "runtime"), or
    InvalidArgument naming the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InvalidArgument(f"cannot read {what} file {p}: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{p}: not valid YAML: {e}") from None


def load_file(path: str | Path) -> common_pb2.FunctionSpec:
    """Read and validate a YAML spec file."""
    return from_dict(read_yaml(path, "spec"), base_dir=Path(path).resolve().parent)


def validate(spec: common_pb2.FunctionSpec) -> None:
    """Check a resolved spec (with its runtime's command: what the
    controller stores); the rules are those of ``validation.check_spec``. A
    developer's spec is checked by ``servingruntime.check_request``.

    Zero values from proto3 mean "unset" only where a default is safe
    (concurrency, max_scale, startup_timeout_ms are filled by ``with_defaults``).
    """
    validation.check_spec(spec)


def with_defaults(spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
    """A copy with proto3 zero values replaced by defaults, validated."""
    out = common_pb2.FunctionSpec()
    out.CopyFrom(spec)
    if out.concurrency == 0:
        out.concurrency = DEFAULT_CONCURRENCY
    if out.max_scale == 0:
        out.max_scale = max(DEFAULT_MAX_SCALE, out.min_scale)
    if out.startup_timeout_ms == 0:
        out.startup_timeout_ms = DEFAULT_STARTUP_TIMEOUT_MS
    if not out.HasField("resources"):
        # Same defaults as a YAML spec without a resources block.
        out.resources.cpu_millis = DEFAULT_CPU_MILLIS
        out.resources.memory_mib = DEFAULT_MEMORY_MIB
    validate(out)
    return out
