"""Input validation: the one set of rules for everything a user sends.

The CLI applies these rules before sending (a convenience: faster, friendlier
errors) and every public RPC applies them again on the server (the guard: a
client in another language, or a hand-made message, gets the same answer).
Every check raises InvalidArgument whose message names the field and the
rule, and quotes at most a short prefix of the offending input (``short``),
so an error about a 100 KiB name is itself small.

Pure functions and constants, no I/O.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from controlplane.runtime.errors import InvalidArgument, ResourceExhausted
from galaxy.v1 import common_pb2

# -- limits (documented in docs/security.md, "Input validation") -------------

# Largest gRPC message any Galaxy server or channel sends or receives, both
# directions (runtime/rpc.py). It must hold the largest listing the
# controller answers: MAX_FUNCTIONS_DEFAULT specs of MAX_SPEC_BYTES each, plus
# cluster status; test_validation checks that budget.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A serialized FunctionSpec (everything a user sends in one deploy).
MAX_SPEC_BYTES = 64 * 1024
# Functions stored in one cluster (the controller's --max-functions default).
MAX_FUNCTIONS_DEFAULT = 500
#: Instances one function may have (its max_scale and min_scale), and
#: instances all functions may keep running idle (their min_scale summed):
#: one deploy must not be able to start thousands of processes.
MAX_INSTANCES_PER_FUNCTION_DEFAULT = 1000
MAX_RESERVED_INSTANCES_DEFAULT = 5000
MAX_NAME_LEN = 63
MAX_COMMAND_ARGS = 256
MAX_ARG_BYTES = 16 * 1024
MAX_ENV_ENTRIES = 128
MAX_ENV_KEY_BYTES = 256
MAX_ENV_VALUE_BYTES = 16 * 1024
MAX_PATH_BYTES = 4096
# Ids and opaque tokens clients pass back (request ids, lease ids).
MAX_ID_BYTES = 256
# Leases one Dispatch request may return (the SDK sends those released since
# its previous Dispatch to that owner: about its concurrency).
MAX_RELEASES = 10_000
# Characters of user input an error message quotes.
QUOTE_CHARS = 32

# Inclusive ranges of the numeric spec fields. Proto3 zero means "default"
# where with_defaults fills one (concurrency, max_scale, startup_timeout_ms).
CPU_MILLIS_MAX = 1_000_000
MEMORY_MIB_MAX = 16_777_216
DISK_MIB_MAX = 16_777_216
GPUS_MAX = 64
CONCURRENCY_MAX = 100_000
SCALE_MAX = 100_000
STARTUP_TIMEOUT_MS_MAX = 600_000
#: A request may run up to a day (a batch inference job is a long request).
REQUEST_TIMEOUT_MS_MAX = 86_400_000
#: Knative's bounds for the KPA stable window: 6 s to 1 h.
STABLE_WINDOW_MS_MIN, STABLE_WINDOW_MS_MAX = 6_000, 3_600_000
#: Scale-to-zero grace and fixed keep-alive: up to a day.
IDLE_MS_MAX = 86_400_000
#: Sleeping instances of one LLM function (each holds its weights in memory).
MAX_ASLEEP = 1_000
KEEPALIVE_POLICIES = ("fixed", "hybrid")
#: what a function may scale on (functions/dispatch/autoscaling/llmsignal.py)
SCALING_METRICS = ("concurrency", "rps", "queue", "kv", "tokens_per_s")
#: an SLO target above this (10 minutes) is a mistake, not a target
SLO_MS_MAX = 600_000
#: a routing hint's bounds (controlplane/runtime/llmprompt.py)
HINT_BLOCKS_MAX, HINT_BLOCK_ID_MAX, ADAPTER_MAX = 64, 32, 64
#: prefill/decode pairing estimates (FunctionSpec.pd): 64 MiB of KV a token is
#: past any model (LLaMA-2-70B: 2.6 MB), 10M prefill tokens/s past any GPU
KV_BYTES_PER_TOKEN_MAX, PREFILL_TPS_MAX = 64 << 20, 1e7

#: Function names leave room for a revision suffix ("-NNNNN") in 63 characters.
MAX_FUNCTION_NAME_LEN = 57
_REVISION_SUFFIX = re.compile(r"-\d{5}$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NAME_RULE = (
    "must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', "
    "starting with a letter and not ending with '-'"
)
# Environment variable names: no '=' (it ends the name) and no NUL.
_ENV_KEY_RE = re.compile(r"^[^=\x00]+$")
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


#: Adaptive batching bounds (docs/models.md): a batch is one call's body.
BATCH_SIZE_MAX = 1024
BATCH_LATENCY_MS_MAX = 10_000


def short(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A repr of at most ``limit`` characters of value, with '…' if cut.

    The one way error messages quote user input: enough to recognise it,
    never enough to make an answer large.
    """
    if isinstance(value, bytes | str) and len(value) > limit:
        return repr(value[:limit]) + "…"
    text = repr(value)
    return text if len(text) <= limit + 2 else text[: limit + 2] + "…"


def key(value: Any) -> str:
    """A user-chosen key as part of a field path (``env.KEY``): as is when
    short plain text, else quoted by ``short``."""
    if isinstance(value, str) and len(value) <= QUOTE_CHARS and _PLAIN_KEY_RE.match(value):
        return value
    return short(value)


def check_name(field: str, name: str) -> str:
    """A DNS-1123 label (function names), or InvalidArgument naming field."""
    if not name:
        raise InvalidArgument(f"{field}: required")
    if len(name) > MAX_NAME_LEN:
        raise InvalidArgument(f"{field}: at most {MAX_NAME_LEN} characters, got {len(name)}")
    if not NAME_RE.match(name):
        raise InvalidArgument(f"{field}: {NAME_RULE}, got {short(name)}")
    return name


def check_id(field: str, value: str, *, required: bool = False) -> str:
    """A client-chosen id or token: bounded length, printable, no NUL."""
    if not value:
        if required:
            raise InvalidArgument(f"{field}: required")
        return value
    if len(value.encode()) > MAX_ID_BYTES:
        raise InvalidArgument(f"{field}: at most {MAX_ID_BYTES} bytes, got {len(value.encode())}")
    if not value.isprintable():
        raise InvalidArgument(f"{field}: must be printable text, got {short(value)}")
    return value


def check_range(field: str, value: int, lo: int, hi: int) -> int:
    """lo <= value <= hi, or InvalidArgument naming field and range."""
    if not lo <= value <= hi:
        hint = " (a negative number sent as unsigned?)" if value > 2**31 else ""
        raise InvalidArgument(f"{field}: must be between {lo} and {hi}, got {value}{hint}")
    return value


def check_text(field: str, value: str, max_bytes: int) -> None:
    """At most max_bytes of UTF-8 and no NUL, or InvalidArgument naming field."""
    n = len(value.encode())
    if n > max_bytes:
        raise InvalidArgument(f"{field}: at most {max_bytes} bytes, got {n}")
    if "\x00" in value:
        # execve cannot pass a NUL; refuse here rather than fail on a node.
        raise InvalidArgument(f"{field}: must not contain NUL characters")


def check_spec(spec: common_pb2.FunctionSpec, *, resolved: bool = True) -> None:
    """Every rule for a FunctionSpec, from YAML or straight from the API.

    resolved=False checks a developer's spec before its serving runtime is
    applied: it has no command yet (``servingruntime.check_request`` checks
    the fields that only such a spec has). Zero values of concurrency,
    max_scale and startup_timeout_ms mean "the default" (``spec.with_defaults``
    fills them in). Counts are checked before the elements they count, so the
    work done is bounded by the limits.
    """
    check_name("name", spec.name)
    if spec.namespace:
        check_name("namespace", spec.namespace)
    if len(spec.name) > MAX_FUNCTION_NAME_LEN:
        raise InvalidArgument(
            f"name: at most {MAX_FUNCTION_NAME_LEN} characters (6 more make revision names), "
            f"got {len(spec.name)}"
        )
    if _REVISION_SUFFIX.search(spec.name):
        raise InvalidArgument(
            f"name: must not end in '-' and five digits (revision names do), got {short(spec.name)}"
        )
    if resolved:
        check_command("command", spec.command)
        check_workdir("workdir", spec.workdir)
    if len(spec.env) > MAX_ENV_ENTRIES:
        raise InvalidArgument(f"env: at most {MAX_ENV_ENTRIES} entries, got {len(spec.env)}")
    for k in sorted(spec.env):
        check_text(f"env key {key(k)}", k, MAX_ENV_KEY_BYTES)
        if not _ENV_KEY_RE.match(k):
            raise InvalidArgument(f"env key {key(k)}: must be non-empty and contain no '='")
        check_text(f"env.{key(k)}", spec.env[k], MAX_ENV_VALUE_BYTES)
    r = spec.resources
    check_range("resources.cpu_millis", r.cpu_millis, 0, CPU_MILLIS_MAX)
    check_range("resources.memory_mib", r.memory_mib, 0, MEMORY_MIB_MAX)
    check_range("resources.gpus", r.gpus, 0, GPUS_MAX)
    check_range("resources.disk_mib", r.disk_mib, 0, DISK_MIB_MAX)
    check_range("concurrency", spec.concurrency, 0, CONCURRENCY_MAX)
    check_range("min_scale", spec.min_scale, 0, SCALE_MAX)
    check_range("max_scale", spec.max_scale, 0, SCALE_MAX)
    if spec.max_scale and spec.min_scale > spec.max_scale:
        raise InvalidArgument(
            f"min_scale: {spec.min_scale} is larger than max_scale {spec.max_scale}"
        )
    check_text("readiness_path", spec.readiness_path, MAX_PATH_BYTES)
    if spec.readiness_path and not spec.readiness_path.startswith("/"):
        raise InvalidArgument(
            f"readiness_path: must start with '/', got {short(spec.readiness_path)}"
        )
    check_range("startup_timeout_ms", spec.startup_timeout_ms, 0, STARTUP_TIMEOUT_MS_MAX)
    check_range("request_timeout_ms", spec.request_timeout_ms, 0, REQUEST_TIMEOUT_MS_MAX)
    check_autoscaling(spec.autoscaling)
    if spec.HasField("pd"):
        check_pd("pd", spec.pd)
        if spec.pd.prefill == spec.name:
            raise InvalidArgument("pd.prefill: another function (this one decodes)")
    if spec.HasField("batching"):
        b = spec.batching
        check_range("batching.max_batch_size", b.max_batch_size, 2, BATCH_SIZE_MAX)
        check_range("batching.max_latency_ms", b.max_latency_ms, 1, BATCH_LATENCY_MS_MAX)
    # Last: each field is within its own bound, so this catches only their sum.
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        raise InvalidArgument(f"function: spec is {size} bytes, at most {MAX_SPEC_BYTES} allowed")


def check_pd(field: str, pd: Any) -> None:
    """A ``PdSpec``: the prefill function's name and the estimates' ranges."""
    check_name(f"{field}.prefill", pd.prefill)
    check_range(f"{field}.kv_bytes_per_token", pd.kv_bytes_per_token, 0, KV_BYTES_PER_TOKEN_MAX)
    if not 0 <= pd.prefill_tps <= PREFILL_TPS_MAX:  # also refuses NaN
        raise InvalidArgument(f"{field}.prefill_tps: between 0 and {PREFILL_TPS_MAX:g} tokens/s")


def check_command(field: str, command: Any) -> None:
    """A process's argv: 1-MAX_COMMAND_ARGS bounded elements, the first
    non-empty, no NUL."""
    if not command:
        raise InvalidArgument(f"{field}: required (the program and its arguments)")
    if len(command) > MAX_COMMAND_ARGS:
        raise InvalidArgument(f"{field}: at most {MAX_COMMAND_ARGS} arguments, got {len(command)}")
    if not command[0]:
        raise InvalidArgument(f"{field}[0]: must not be empty")
    for i, arg in enumerate(command):
        check_text(f"{field}[{i}]", arg, MAX_ARG_BYTES)


def check_workdir(field: str, workdir: str) -> None:
    """ "" or a bounded absolute path."""
    check_text(field, workdir, MAX_PATH_BYTES)
    if workdir and not os.path.isabs(workdir):
        raise InvalidArgument(f"{field}: must be an absolute path, got {short(workdir)}")


def _check_fraction(field: str, value: float, lo: float, hi: float) -> None:
    """0 (the default) or a finite number in [lo, hi]."""
    if value != 0 and not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidArgument(
            f"{field}: must be 0 (the default) or between {lo} and {hi}, got {value}"
        )


def check_autoscaling(a: Any) -> None:
    """An AutoscalingSpec: every field 0/empty (the default) or in range."""
    p = "autoscaling."
    _check_fraction(p + "target_utilization", a.target_utilization, 0.01, 1.0)
    if a.stable_window_ms:
        check_range(
            p + "stable_window_ms", a.stable_window_ms, STABLE_WINDOW_MS_MIN, STABLE_WINDOW_MS_MAX
        )
    _check_fraction(p + "panic_window_percent", a.panic_window_percent, 1.0, 100.0)
    check_range(p + "scale_to_zero_grace_ms", a.scale_to_zero_grace_ms, 0, IDLE_MS_MAX)
    if a.keepalive and a.keepalive not in KEEPALIVE_POLICIES:
        raise InvalidArgument(
            f"{p}keepalive: must be one of {', '.join(KEEPALIVE_POLICIES)} or empty, "
            f"got {short(a.keepalive)}"
        )
    check_range(p + "keepalive_ms", a.keepalive_ms, 0, IDLE_MS_MAX)
    if a.keepalive_ms and a.keepalive == "hybrid":
        raise InvalidArgument(f"{p}keepalive_ms: applies only to keepalive 'fixed'")
    if a.metric and a.metric not in SCALING_METRICS:
        raise InvalidArgument(
            f"{p}metric: must be one of {', '.join(SCALING_METRICS)} or empty, "
            f"got {short(a.metric)}"
        )
    if not (math.isfinite(a.target) and a.target >= 0) or (a.metric == "kv" and a.target > 1):
        bound = "between 0 and 1 (KV use is a fraction)" if a.metric == "kv" else ">= 0"
        raise InvalidArgument(f"{p}target: must be {bound}, got {a.target}")
    check_range(p + "ttft_ms", a.ttft_ms, 0, SLO_MS_MAX)
    check_range(p + "tpot_ms", a.tpot_ms, 0, SLO_MS_MAX)
    check_range(p + "max_asleep", a.max_asleep, 0, MAX_ASLEEP)
    check_range(p + "keep_asleep_ms", a.keep_asleep_ms, 0, IDLE_MS_MAX)


def check_dispatch(request: Any) -> None:
    """A DispatchRequest: function name, request id, piggybacked releases."""
    check_name("function", request.function)
    check_id("request_id", request.request_id)
    hint = request.hint
    if len(hint.prefix_blocks) > HINT_BLOCKS_MAX:
        raise InvalidArgument(f"hint.prefix_blocks: at most {HINT_BLOCKS_MAX}")
    if any(len(b) > HINT_BLOCK_ID_MAX for b in hint.prefix_blocks):
        raise InvalidArgument(f"hint.prefix_blocks: each at most {HINT_BLOCK_ID_MAX} characters")
    check_text("hint.adapter", hint.adapter, ADAPTER_MAX)
    if hint.decode_node:
        check_text("hint.decode_node", hint.decode_node, 253)
        check_pd("hint.pd", hint.pd)
    if request.tag:
        check_name("tag", request.tag)
    check_releases(request.releases)


def check_releases(releases: Any, required: bool = False) -> None:
    """Releases riding on another message: bounded, each well formed."""
    if len(releases) > MAX_RELEASES:
        raise InvalidArgument(f"releases: at most {MAX_RELEASES} per request, got {len(releases)}")
    for i, rel in enumerate(releases):
        check_release(rel, prefix=f"releases[{i}].", required=required)


def check_release(request: Any, *, prefix: str = "", required: bool = True) -> None:
    """A ReleaseRequest: a bounded lease id and, when given, a function name."""
    check_id(prefix + "lease_id", request.lease_id, required=required)
    if request.function:
        check_name(prefix + "function", request.function)


def check_instance_quota(
    spec: Any, per_function: int, reserved_elsewhere: int, reserved: int
) -> None:
    """max_scale/min_scale within the per-function bound, and the cluster's
    min_scale total within its bound, else RESOURCE_EXHAUSTED naming the field."""
    for field in ("min_scale", "max_scale"):
        n = getattr(spec, field)
        if n > per_function:
            raise ResourceExhausted(
                f"{field}: {n} is above the cluster's limit of {per_function} instances per "
                "function (controller --max-instances-per-function)"
            )
    if reserved_elsewhere + spec.min_scale > reserved:
        raise ResourceExhausted(
            f"min_scale: {spec.min_scale} more kept instances would make "
            f"{reserved_elsewhere + spec.min_scale}, above the cluster's limit of {reserved} "
            "(controller --max-reserved-instances)"
        )


def check_function_count(existing: int, limit: int) -> None:
    """A new function fits under the cluster's bound, else RESOURCE_EXHAUSTED."""
    if existing >= limit:
        raise ResourceExhausted(
            f"functions: the cluster holds {existing} functions, at most {limit} "
            "allowed (controller --max-functions); delete one first"
        )
