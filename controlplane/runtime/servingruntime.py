"""Serving runtimes: the rules for a ServingRuntime, and resolving a
developer's FunctionSpec against one (pure: no I/O).

No API caller chooses the command a node agent runs. An admin registers
runtimes (``Controller.PutRuntime``); a spec names one and gives only an
artifact, flags and environment within the runtime's rules. The controller
resolves the spec into the command and workdir it stores, so Dispatch,
Schedule and node agents still read ``command`` and need not know about
runtimes. The CLI runs the same ``resolve`` before sending (earlier
errors); the controller is the guard.

Every refusal is InvalidArgument naming the field and the rule, quoting user
input only through ``validation.short``.
"""

from __future__ import annotations

import re
from typing import Any

from controlplane.runtime import models, validation
from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.validation import check_name, check_range, check_text, key, short
from galaxy.v1 import common_pb2

#: Placeholders of a runtime's command template.
ARGS = "{args}"
ARTIFACT = "{artifact}"
#: A spec's args when the runtime's max_args is 0.
DEFAULT_MAX_ARGS = 32
#: Bounds on what a runtime lists (an admin's input is checked too).
MAX_DESCRIPTION_BYTES = 1024
MAX_LIST = 256
MAX_SUFFIX_BYTES = 64
MAX_RUNTIME_BYTES = validation.MAX_SPEC_BYTES
#: Runtimes one cluster holds (bounds ListRuntimes: 100 x 64 KiB).
MAX_RUNTIMES = 100
#: An allowed flag: "--" and a name (what a spec's arg is matched against).
FLAG_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_URI_RE = re.compile(r"^[a-z][a-z0-9+.-]*://")


def emulated() -> common_pb2.ServingRuntime:
    """The runtime of emulated sandboxes, which start no process (the
    command is never run): what benchmarks and control plane tests name."""
    return common_pb2.ServingRuntime(
        name="emulated",
        command=["emulated"],
        description="for emulated sandboxes (--sandbox emulated): nothing is run",
    )


def _listing(values: Any, limit: int = 5) -> str:
    """A runtime's allow-list for an error message: a few entries, not all."""
    vals = list(values)
    text = ", ".join(vals[:limit]) + (", …" if len(vals) > limit else "")
    return text or "none"


def _is_uri(prefix: str) -> bool:
    return bool(_URI_RE.match(prefix))


def check_runtime(rt: common_pb2.ServingRuntime) -> None:
    """Every rule for a ServingRuntime, or InvalidArgument naming the field."""
    check_name("name", rt.name)
    validation.check_command("command", rt.command)
    if ARTIFACT in rt.command[0] or rt.command[0] == ARGS:
        # The program itself is the admin's choice, never the developer's.
        raise InvalidArgument("command[0]: must be the program, not a placeholder")
    n_args = 0
    for i, part in enumerate(rt.command):
        if ARGS in part:
            if part != ARGS:
                raise InvalidArgument(f"command[{i}]: {ARGS} must be a whole element")
            n_args += 1
    if n_args > 1:
        raise InvalidArgument(f"command: {ARGS} may appear once, got {n_args}")
    check_text("description", rt.description, MAX_DESCRIPTION_BYTES)
    validation.check_workdir("workdir", rt.workdir)
    _check_artifact_rules(rt)
    _check_list("allowed_args", rt.allowed_args)
    for i, flag in enumerate(rt.allowed_args):
        if not FLAG_RE.match(flag):
            raise InvalidArgument(
                f"allowed_args[{i}]: must be a flag like --model-name, got {short(flag)}"
            )
    if rt.allowed_args and not n_args:
        raise InvalidArgument(f"allowed_args: the command has no {ARGS} element to put them in")
    check_range("max_args", rt.max_args, 0, validation.MAX_COMMAND_ARGS)
    _check_list("allowed_env", rt.allowed_env)
    for i, k in enumerate(rt.allowed_env):
        check_text(f"allowed_env[{i}]", k, validation.MAX_ENV_KEY_BYTES)
        if not k or "=" in k:
            raise InvalidArgument(f"allowed_env[{i}]: must be non-empty and contain no '='")
    r = rt.resources
    check_range("resources.cpu_millis", r.cpu_millis, 0, validation.CPU_MILLIS_MAX)
    check_range("resources.memory_mib", r.memory_mib, 0, validation.MEMORY_MIB_MAX)
    check_range("resources.gpus", r.gpus, 0, validation.GPUS_MAX)
    check_range("resources.disk_mib", r.disk_mib, 0, validation.DISK_MIB_MAX)
    check_text("readiness_path", rt.readiness_path, validation.MAX_PATH_BYTES)
    if rt.readiness_path and not rt.readiness_path.startswith("/"):
        raise InvalidArgument(
            f"readiness_path: must start with '/', got {short(rt.readiness_path)}"
        )
    check_range("startup_timeout_ms", rt.startup_timeout_ms, 0, validation.STARTUP_TIMEOUT_MS_MAX)
    check_range("concurrency", rt.concurrency, 0, validation.CONCURRENCY_MAX)
    size = rt.ByteSize()
    if size > MAX_RUNTIME_BYTES:
        raise InvalidArgument(f"runtime: {size} bytes, at most {MAX_RUNTIME_BYTES} allowed")


def _check_list(field: str, values: Any) -> None:
    if len(values) > MAX_LIST:
        raise InvalidArgument(f"{field}: at most {MAX_LIST} entries, got {len(values)}")


def _check_artifact_rules(rt: common_pb2.ServingRuntime) -> None:
    a = rt.artifact
    takes = any(ARTIFACT in part for part in rt.command)
    if a.required and not takes:
        raise InvalidArgument(f"artifact.required: the command has no {ARTIFACT} to put it in")
    if takes and not a.prefixes:
        # Deny by default: an admin admits "any absolute path" by writing "/".
        raise InvalidArgument(
            f"artifact.prefixes: required when the command has {ARTIFACT} "
            "(e.g. /opt/models or s3://bucket/; '/' admits any absolute path)"
        )
    _check_list("artifact.prefixes", a.prefixes)
    for i, p in enumerate(a.prefixes):
        field = f"artifact.prefixes[{i}]"
        check_text(field, p, validation.MAX_PATH_BYTES)
        if not (p.startswith("/") or _is_uri(p)):
            raise InvalidArgument(
                f"{field}: must be an absolute path or a URI prefix like s3://, got {short(p)}"
            )
        if ".." in _components(p):
            raise InvalidArgument(f"{field}: must not contain a '..' component")
    _check_list("artifact.suffixes", a.suffixes)
    for i, sfx in enumerate(a.suffixes):
        check_text(f"artifact.suffixes[{i}]", sfx, MAX_SUFFIX_BYTES)
        if not sfx:
            raise InvalidArgument(f"artifact.suffixes[{i}]: must not be empty")
    check_range("artifact.max_length", a.max_length, 0, validation.MAX_PATH_BYTES)


def _components(path: str) -> list[str]:
    """Path components of an artifact (a URI's too: s3://b/../x has one '..')."""
    return re.split(r"[/\\]", path)


def _prefix_ok(artifact: str, prefix: str) -> bool:
    if _is_uri(prefix) or prefix.endswith("/"):
        return artifact.startswith(prefix)
    # A path prefix matches whole components: /opt/m admits /opt/m/x, not /opt/mx.
    return artifact == prefix or artifact.startswith(prefix + "/")


def check_request(spec: common_pb2.FunctionSpec) -> None:
    """A developer's spec as DeployFunction receives it, before its runtime
    is known: names a runtime, sets neither command nor workdir (both are
    the runtime's), bounded artifact and args, and every other spec rule."""
    # First: an old client sending a command learns what to do instead.
    if spec.command:
        raise InvalidArgument("command: set by the runtime; name a runtime instead")
    if spec.workdir:
        raise InvalidArgument("workdir: set by the runtime; name a runtime instead")
    check_name("runtime", spec.runtime)
    check_text("artifact", spec.artifact, validation.MAX_PATH_BYTES)
    if len(spec.args) > validation.MAX_COMMAND_ARGS:
        raise InvalidArgument(
            f"args: at most {validation.MAX_COMMAND_ARGS} arguments, got {len(spec.args)}"
        )
    for i, arg in enumerate(spec.args):
        check_text(f"args[{i}]", arg, validation.MAX_ARG_BYTES)
    if spec.HasField("model"):
        models.check(spec.model)
    validation.check_spec(spec, resolved=False)


def _check_artifact(spec: common_pb2.FunctionSpec, rt: common_pb2.ServingRuntime) -> None:
    art, rules, name = spec.artifact, rt.artifact, rt.name
    if not art:
        if rules.required:
            raise InvalidArgument(f"artifact: required by runtime {name}")
        return
    if not any(ARTIFACT in part for part in rt.command):
        raise InvalidArgument(f"artifact: runtime {name} takes no artifact, got {short(art)}")
    limit = rules.max_length or validation.MAX_PATH_BYTES
    if len(art.encode()) > limit:
        raise InvalidArgument(
            f"artifact: at most {limit} bytes (runtime {name}), got {len(art.encode())}"
        )
    if not art.isprintable():
        raise InvalidArgument(f"artifact: must be printable text, got {short(art)}")
    if ".." in _components(art):
        raise InvalidArgument(f"artifact: must not contain a '..' component, got {short(art)}")
    if not any(_prefix_ok(art, p) for p in rules.prefixes):
        raise InvalidArgument(
            f"artifact: runtime {name} admits only artifacts under "
            f"{_listing(rules.prefixes, 3)}; got {short(art)}"
        )
    if rules.suffixes and not any(art.endswith(sfx) for sfx in rules.suffixes):
        raise InvalidArgument(
            f"artifact: runtime {name} admits only artifacts ending in "
            f"{_listing(rules.suffixes, 3)}; got {short(art)}"
        )


def _check_args(spec: common_pb2.FunctionSpec, rt: common_pb2.ServingRuntime) -> None:
    limit = rt.max_args or DEFAULT_MAX_ARGS
    if len(spec.args) > limit:
        raise InvalidArgument(
            f"args: runtime {rt.name} admits at most {limit}, got {len(spec.args)}"
        )
    allowed = set(rt.allowed_args)
    for i, arg in enumerate(spec.args):
        flag = arg.partition("=")[0]
        if flag not in allowed:
            raise InvalidArgument(
                f"args[{i}]: runtime {rt.name} admits only --flag or --flag=value with a flag "
                f"of its allowed_args ({_listing(rt.allowed_args)}); got {short(arg)}"
            )


def env_allowed(k: str, allowed: Any) -> bool:
    """Does an allowed_env list admit key k (a trailing '*' is a prefix)?"""
    for a in allowed:
        if a.endswith("*"):
            if k.startswith(a[:-1]):
                return True
        elif k == a:
            return True
    return False


def _check_env(spec: common_pb2.FunctionSpec, rt: common_pb2.ServingRuntime) -> None:
    for k in sorted(spec.env):
        if not env_allowed(k, rt.allowed_env):
            raise InvalidArgument(
                f"env key {key(k)}: runtime {rt.name} does not admit it "
                f"(allowed_env: {_listing(rt.allowed_env)})"
            )


def expand(rt: common_pb2.ServingRuntime, artifact: str, args: Any) -> list[str]:
    """The command of the runtime's template for this artifact and args."""
    out: list[str] = []
    for part in rt.command:
        if part == ARGS:
            out.extend(args)
        elif part == ARTIFACT and not artifact:
            continue  # an optional artifact left out: no empty argument
        else:
            # One pass over the template: text from the artifact is never
            # scanned for placeholders again.
            out.append(part.replace(ARTIFACT, artifact))
    return out


def resolve(
    spec: common_pb2.FunctionSpec, rt: common_pb2.ServingRuntime
) -> common_pb2.FunctionSpec:
    """The spec to store: the developer's spec checked against the runtime,
    with command and workdir from it and its defaults where the spec left a
    field 0 or empty. Raises InvalidArgument naming the field and the rule."""
    check_request(spec)
    if spec.runtime != rt.name:
        raise InvalidArgument(f"runtime: the spec names {short(spec.runtime)}, not {rt.name}")
    _check_artifact(spec, rt)
    _check_args(spec, rt)
    _check_env(spec, rt)
    if any(models.PLACEHOLDER in part for part in rt.command) and not spec.HasField("model"):
        raise InvalidArgument(
            f"model: runtime {rt.name} hands a model to its command ({models.PLACEHOLDER}); "
            "the spec names none (model: {uri: ...})"
        )
    out = common_pb2.FunctionSpec()
    out.CopyFrom(spec)
    out.command[:] = expand(rt, spec.artifact, spec.args)
    out.workdir = rt.workdir
    if rt.HasField("resources"):
        # The runtime's block replaces the cluster's defaults (used only
        # when neither sets one, spec.with_defaults); a field the spec left
        # 0 takes the runtime's value.
        for f in ("cpu_millis", "memory_mib", "gpus", "disk_mib"):
            if not getattr(out.resources, f):
                setattr(out.resources, f, getattr(rt.resources, f))
    if not out.concurrency:
        out.concurrency = rt.concurrency
    if not out.readiness_path:
        out.readiness_path = rt.readiness_path
    if not out.startup_timeout_ms:
        out.startup_timeout_ms = rt.startup_timeout_ms
    out.llm = rt.llm  # the runtime's to say, never the caller's
    if spec.autoscaling.max_asleep and not rt.llm:  # only an LLM runtime sleeps
        raise InvalidArgument(
            f"autoscaling.max_asleep: runtime {rt.name} is not an LLM runtime (llm: true)"
        )
    validation.check_spec(out)  # the resolved command's bounds, the total size
    return out
