"""Serving runtime files: YAML -> ServingRuntime proto (what `galaxy runtimes
apply -f` and `galaxy up --runtimes DIR` read).

A relative ``workdir`` or artifact prefix is taken relative to the file's
directory, as a function spec's relative artifact is, so the runtimes in
the repo's examples/runtimes admit the repo's examples wherever it is
checked out. Every field is checked by ``servingruntime.check_runtime``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from controlplane.runtime import servingruntime
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.spec import read_yaml
from controlplane.runtime.validation import key, short
from galaxy.v1 import common_pb2

_TOP = {
    "name",
    "description",
    "command",
    "workdir",
    "artifact",
    "allowed_args",
    "max_args",
    "allowed_env",
    "resources",
    "readiness_path",
    "startup_timeout_ms",
    "concurrency",
    "llm",
}
_ARTIFACT = {"required", "prefixes", "suffixes", "max_length"}
_RES = {"cpu_millis", "memory_mib", "gpus", "disk_mib"}


def _check_keys(doc: dict[str, Any], allowed: set[str], where: str) -> None:
    bad = sorted(str(k) for k in set(doc) - allowed)
    if bad:
        raise InvalidArgument(
            f"{where}{key(bad[0])}: unknown field (allowed: {', '.join(sorted(allowed))})"
        )


def _strings(doc: dict[str, Any], name: str) -> list[str]:
    v = doc.get(name, []) or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InvalidArgument(f"{name}: must be a list of strings")
    return v


def _uint(doc: dict[str, Any], name: str, path: str) -> int:
    v = doc.get(name, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
        raise InvalidArgument(f"{path}: must be a non-negative integer, got {short(v)}")
    return v


def _path(value: str, base_dir: Path | None) -> str:
    """A relative path made absolute against base_dir (URIs stay as they are)."""
    if not value or base_dir is None or os.path.isabs(value) or "://" in value:
        return value
    return str((base_dir / value).resolve())


def from_dict(doc: Any, base_dir: Path | None = None) -> common_pb2.ServingRuntime:
    """A checked ServingRuntime from a parsed YAML document."""
    if not isinstance(doc, dict):
        raise InvalidArgument("runtime: must be a mapping with at least 'name' and 'command'")
    _check_keys(doc, _TOP, "")
    rt = common_pb2.ServingRuntime()
    for field in ("name", "description", "workdir", "readiness_path"):
        v = doc.get(field, "")
        if not isinstance(v, str):
            raise InvalidArgument(f"{field}: must be a string")
        setattr(rt, field, v)
    rt.workdir = _path(rt.workdir, base_dir)
    command = doc.get("command")
    if isinstance(command, str):
        raise InvalidArgument('command: must be a list of strings, e.g. [python3, "{artifact}"]')
    rt.command.extend(_strings(doc, "command"))
    art = doc.get("artifact") or {}
    if not isinstance(art, dict):
        raise InvalidArgument(
            "artifact: must be a mapping (required, prefixes, suffixes, max_length)"
        )
    _check_keys(art, _ARTIFACT, "artifact.")
    if not isinstance(art.get("required", False), bool):
        raise InvalidArgument("artifact.required: must be true or false")
    rt.artifact.required = art.get("required", False)
    rt.artifact.prefixes.extend(_path(p, base_dir) for p in _strings(art, "prefixes"))
    rt.artifact.suffixes.extend(_strings(art, "suffixes"))
    rt.artifact.max_length = _uint(art, "max_length", "artifact.max_length")
    rt.allowed_args.extend(_strings(doc, "allowed_args"))
    rt.max_args = _uint(doc, "max_args", "max_args")
    rt.allowed_env.extend(_strings(doc, "allowed_env"))
    res = doc.get("resources")
    if res is not None:
        if not isinstance(res, dict):
            raise InvalidArgument(
                "resources: must be a mapping (cpu_millis, memory_mib, gpus, disk_mib)"
            )
        _check_keys(res, _RES, "resources.")
        for f in sorted(_RES):
            setattr(rt.resources, f, _uint(res, f, f"resources.{f}"))
    rt.startup_timeout_ms = _uint(doc, "startup_timeout_ms", "startup_timeout_ms")
    rt.concurrency = _uint(doc, "concurrency", "concurrency")
    if not isinstance(doc.get("llm", False), bool):
        raise InvalidArgument("llm: must be true or false")
    rt.llm = doc.get("llm", False)
    servingruntime.check_runtime(rt)
    return rt


def load_file(path: str | Path) -> common_pb2.ServingRuntime:
    """Read and check one runtime YAML file."""
    p = Path(path)
    doc = read_yaml(p, "runtime")
    try:
        return from_dict(doc, base_dir=p.resolve().parent)
    except InvalidArgument as e:
        raise InvalidArgument(f"{p.name}: {e.message}") from None


def load_dir(directory: str | Path) -> list[common_pb2.ServingRuntime]:
    """Every runtime file (*.yaml, *.yml) of a directory, by file name."""
    d = Path(directory)
    files = sorted([*d.glob("*.yaml"), *d.glob("*.yml")])
    return [load_file(f) for f in files]
