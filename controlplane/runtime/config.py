"""Typed configuration: one pydantic model per component, defaults in one
place, command-line flags derived from the models.

Why pydantic: the rules (ranges, choices, lengths) are declared once on the
field and enforced wherever a config is made: from flags (`galaxy serve`),
from code (the in-process test cluster, `galaxy up`, bench plans, the
simulator) or from a file. argparse only parses: each flag's ``type`` is the
field's own validator, so a bad value fails at parse time with the flag named
and the same rule as everywhere else.

A field becomes ``--field-name`` unless ``flag=`` names it; a bool that
defaults to False is a switch (``--name``), one that defaults to True is
switched off by ``--no-name``; a ``list`` field is a repeatable flag. A
field with ``env=`` takes its flag's default from that environment variable
when the parser is built (a config made in code never reads it); one with
``cli=False`` is never a flag (what only code can give: loaded credentials).
"""

from __future__ import annotations

import argparse
import copy
import os
import types
import typing
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from controlplane.runtime.tls import TlsConfig
from controlplane.runtime.validation import MAX_MESSAGE_BYTES

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A configuration value broke its field's rule (the message names the
    flag and the rule, never more than a short prefix of the value)."""


class Config(BaseModel):
    """Base of every component's configuration: immutable, no unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied, validated like a new config."""
        return type(self).model_validate({**self.model_dump(), **changes})


def setting(
    default: Any,
    help: str = "",
    *,
    flag: str | None = None,
    group: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    env: str | None = None,
    cli: bool = True,
    **rules: Any,
) -> Any:
    """A config field: its default, help text, optional flag name and
    argparse group, the environment variable its flag's default comes from,
    whether it is a flag at all, and pydantic rules (``ge``, ``gt``, ``le``,
    ``max_length``, ``repr`` ...)."""
    extra: dict[str, Any] = {"flag": flag, "group": group, "metavar": metavar, "env": env}
    if not cli:
        extra["code_only"] = True
    if choices:
        extra["choices"] = list(choices)
    return Field(
        default, description=help, json_schema_extra={k: v for k, v in extra.items() if v}, **rules
    )


def _extra(info: Any) -> dict[str, Any]:
    e = info.json_schema_extra
    return e if isinstance(e, dict) else {}


def same_as(cls: type[Config], name: str, **changes: Any) -> Any:
    """Field ``name`` of ``cls`` (default, help, rules) as a field of another
    config, with ``changes`` to its ``flag``, ``group`` or ``help``: a
    setting two commands share (`galaxy up` passing it on to `galaxy serve
    controller`) keeps one default and one rule. The other config declares
    the same type."""
    info = copy.copy(cls.model_fields[name])
    if "help" in changes:
        info.description = changes.pop("help")
    info.json_schema_extra = {**_extra(info), **changes}
    return info


def _annotation(cls: type[Config], name: str) -> Any:
    # pydantic resolved the annotation when it built the class (its rules
    # moved to ``metadata``); ``typing.get_type_hints`` would compile every
    # string annotation of the class again on each call, which was a third of
    # a component's start-up CPU.
    return cls.model_fields[name].annotation


def flag_of(cls: type[Config], name: str) -> str:
    """The command-line flag of field ``name``."""
    info = cls.model_fields[name]
    explicit = _extra(info).get("flag")
    if explicit:
        return str(explicit)
    if _annotation(cls, name) is bool and info.default is True:
        return "--no-" + name.replace("_", "-")
    return "--" + name.replace("_", "-")


def _short(value: object) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _validator(cls: type[Config], name: str, item_type: Any) -> Any:
    """An argparse ``type`` applying the field's rules to one value."""
    info = cls.model_fields[name]
    rules = [m for m in info.metadata]
    choices = _extra(info).get("choices")
    # Built on the flag's first use: a process is given a few of its
    # hundred flags, and each adapter costs pydantic a schema build.
    adapter: list[TypeAdapter[Any]] = []

    def parse(text: str) -> Any:
        if choices and text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}")
        if not adapter:
            adapter.append(TypeAdapter(typing.Annotated[item_type, *rules] if rules else item_type))
        try:
            return adapter[0].validate_python(text)
        except ValidationError as e:
            msg = str(e.errors()[0]["msg"]).removeprefix("Value error, ")
            raise argparse.ArgumentTypeError(msg) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def flag_fields(cls: type[Config]) -> list[str]:
    """The fields of ``cls`` that are command-line flags."""
    return [n for n, info in cls.model_fields.items() if not _extra(info).get("code_only")]


def add_arguments(
    parser: Any, cls: type[Config], fields: typing.Iterable[str] | None = None
) -> None:
    """Add one flag per field of ``cls`` (grouped by each field's ``group``),
    or per field named in ``fields``."""
    groups: dict[str, Any] = {}
    wanted = flag_fields(cls) if fields is None else list(fields)
    for name in wanted:
        info = cls.model_fields[name]
        extra = _extra(info)
        target: Any = parser
        if extra.get("group"):
            g = str(extra["group"])
            target = groups.get(g) or groups.setdefault(g, parser.add_argument_group(g))
        ann = _annotation(cls, name)
        flag = flag_of(cls, name)
        help_text = info.description or ""
        kw: dict[str, Any] = {"dest": name, "help": help_text}
        if extra.get("metavar"):
            kw["metavar"] = extra["metavar"]
        if info.is_required():  # no default: the flag must be given
            kw.update(required=True, type=_validator(cls, name, _optional_inner(ann)))
        elif ann is bool:
            kw["action"] = "store_false" if info.default is True else "store_true"
            kw["default"] = info.default
        elif get_origin(ann) is list:
            kw.update(action="append", default=None, type=_validator(cls, name, get_args(ann)[0]))
        else:
            inner = _optional_inner(ann)
            default = info.default
            if extra.get("env"):
                # Read now, so `--help` shows it; argparse runs a string
                # default through ``type``: a bad value fails naming the flag.
                default = os.environ.get(str(extra["env"]), default)
            kw.update(default=default, type=_validator(cls, name, inner))
            if info.default is not None and "default" not in help_text:
                kw["help"] = (help_text + f" (default {info.default})").strip()
        target.add_argument(flag, **kw)


def _optional_inner(ann: Any) -> Any:
    """``T`` for ``T | None``, else ``ann``."""
    if get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


def from_args(cls: type[C], args: argparse.Namespace, **more: Any) -> C:
    """The config of ``cls`` from parsed flags (fields not on the namespace
    keep their defaults; a repeatable flag never given keeps its default),
    and ``more`` (fields that are no flag of this parser)."""
    values = dict(more)
    for name in flag_fields(cls):
        if not hasattr(args, name):
            continue
        v = getattr(args, name)
        if v is None and get_origin(_annotation(cls, name)) is list:
            continue
        values[name] = v
    return build(cls, **values)


def build(cls: type[C], **values: Any) -> C:
    """``cls(**values)``, with a failure as a ``ConfigError`` naming the flag."""
    try:
        return cls(**values)
    except ValidationError as e:
        err = e.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        if loc in cls.model_fields:
            raise ConfigError(
                f"{flag_of(cls, loc)}: {msg} (got {_short(err.get('input'))})"
            ) from None
        # A rule across fields: its message names them; the input is all of them.
        raise ConfigError(f"{cls.__name__}: {msg}") from None


def to_flags(cfg: Config) -> list[str]:
    """The command line that gives ``cfg`` (fields at their default are
    left out): for building another process's command from a config."""
    cls, out = type(cfg), []
    for name in flag_fields(cls):
        info = cls.model_fields[name]
        value = getattr(cfg, name)
        if not info.is_required() and value == info.default:
            continue
        flag = flag_of(cls, name)
        if isinstance(value, bool):
            out.append(flag)  # a switch: given means the other value
        elif isinstance(value, list):
            for item in value:
                out += [flag, str(item)]
        elif value is not None:
            out += [flag, str(value)]
    return out


#: Thresholds of the garbage collector: Python's own, measured best for the
#: tail. Every gRPC call leaves a few objects in reference cycles, so a young
#: collection frees about as many objects as its threshold: 0.4 ms of CPU at
#: 700, 1.0 ms at 2,000, 9 ms (up to 20) at 10,000, for the same total
#: (docs/results/benchmarks-2026-11.md, 2026-11-25). Freezing is what shortens full ones.
GC_THRESHOLDS = (700, 10, 10)

#: The gRPC message size limit every server and channel sets, both ways
#: (the controller bounds its largest answer below it: ``validation``).
DEFAULT_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES


#: Bearer-token modes of a server with a public API: ``auto`` = tokens
#: with TLS, none without (docs/security.md).
AUTH_MODES = ("auto", "tokens", "none")


class RpcConfig(Config):
    """What every gRPC server and channel of a process takes: deadlines,
    message size limits, the connection cache, transport credentials and
    tokens (``rpc.ChannelPool.of``, ``rpc.create_server``, ``host.serve``,
    the SDK's ``GalaxyClient``).

    Credentials come in two forms: the flags (``--tls-dir``,
    ``--tls-server-name``, ``--insecure``, ``--auth``, ``--token-cache-s``)
    and what they resolve to, which only code can set (``tls``: the files
    of this process's identity, ``tlsfiles.resolve``; ``token``: the bearer
    token a client sends). Servers and channels use the resolved form.
    """

    connection_cache: bool = setting(
        True,
        "reuse one channel per peer address (off: every call opens and closes one; "
        "the ablation of the connection cache)",
        flag="--no-connection-cache",
    )
    agent_streams: bool = setting(
        True,
        "send CreateInstance and DeleteInstance to node agents as messages on one "
        "InstanceStream per agent (off: a unary call each; the A/B switch of the stream)",
        flag="--no-agent-streams",
    )
    stream_batches: bool = setting(
        True,
        "DispatchStream and InstanceStream servers read batched messages and batch their "
        "replies: what queued during a write goes as one (off: a message per write; the "
        "A/B switch)",
        flag="--no-stream-batches",
    )
    heartbeat_batches: bool = setting(
        True,
        "node agents send the heartbeats of their nodes due together as one message on "
        "ClusterMgr.HeartbeatBatches (off: one message per node on Heartbeats; the A/B "
        "switch of the batches)",
        flag="--no-heartbeat-batches",
    )
    deadline_s: float = setting(
        10.0, "deadline of an outgoing RPC that sets none, seconds", gt=0, flag="--rpc-deadline-s"
    )
    max_message_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES,
        "largest gRPC message sent or received, bytes",
        ge=1024,
        flag="--max-message-bytes",
    )
    tls_dir: str | None = setting(
        None,
        "mutual TLS: a `galaxy certs` directory with ca.pem and this kind's "
        "certificate and key (default $GALAXY_TLS_DIR); required unless --insecure",
        env="GALAXY_TLS_DIR",
    )
    tls_server_name: str | None = setting(
        None,
        "check this name in peers' certificates instead of the host dialled "
        "(Kubernetes: a name every component certificate carries; default "
        "$GALAXY_TLS_SERVER_NAME)",
        env="GALAXY_TLS_SERVER_NAME",
    )
    insecure: bool = setting(
        False, "serve plaintext gRPC with no authentication (local experiments only)"
    )
    auth: str = setting(
        "auto",
        "bearer tokens on the public API: tokens, none, or auto (= tokens with TLS, "
        "none with --insecure; default $GALAXY_AUTH or auto)",
        choices=AUTH_MODES,
        env="GALAXY_AUTH",
    )
    token_cache_s: float = setting(
        10.0,
        "how long a verified token is trusted before it is looked up again "
        "(a revoked token is refused by this server within this time; default 10)",
    )
    tls: TlsConfig | None = setting(
        None, "mutual TLS files of this process (None: plaintext)", cli=False
    )
    token: str | None = setting(
        None, "bearer token sent with every call (None: none)", cli=False, repr=False
    )

    def tokens_enabled(self) -> bool:
        """Does a server with a public API check bearer tokens? ValueError
        for tokens without TLS: a token sent in plaintext can be read off
        the wire."""
        if self.auth == "tokens" and self.tls is None:
            raise ValueError(
                "--auth tokens needs TLS (--tls-dir); tokens in plaintext can be stolen"
            )
        return self.auth == "tokens" or (self.auth == "auto" and self.tls is not None)


#: ``RpcConfig``'s token flags: only the kinds with a public API have them
#: (the controller and Dispatch; the gateway has ``--auth`` alone).
TOKEN_FLAGS = ("auth", "token_cache_s")
#: The ``RpcConfig`` flags every `galaxy serve` kind has.
COMMON_RPC_FLAGS = tuple(n for n in flag_fields(RpcConfig) if n not in TOKEN_FLAGS)


def rpc_of(args: argparse.Namespace) -> RpcConfig:
    """A `galaxy serve` process's ``RpcConfig``: the one its CLI resolved
    (``args.rpc``: credentials loaded), else the one its flags give."""
    rpc = getattr(args, "rpc", None)
    return rpc if isinstance(rpc, RpcConfig) else from_args(RpcConfig, args)


class GcConfig(Config):
    """How a server process keeps Python's cycle collector out of its tail
    latency (``controlplane.runtime.gctune``, applied by ``host.serve`` once
    the process is ready). A full collection walks every tracked object of
    the heap (the modules of grpc, protobuf and pydantic make that hundreds
    of thousands) and stops the process while it does: tens of milliseconds
    on a busy core, a tail that every request in flight pays. Freezing what
    start-up made keeps full collections to what was made since. The
    thresholds are there to be measured (docs/results/benchmarks-2026-11.md, 2026-11-25):
    larger ones made young collections rarer but each one longer."""

    gc_freeze: bool = setting(
        True,
        "freeze the start-up heap (gc.freeze) once the process is ready, so that "
        "collections never walk it (off: the interpreter's default behaviour)",
        flag="--no-gc-freeze",
        group="garbage collector",
    )
    gc_threshold0: int = setting(
        GC_THRESHOLDS[0],
        "allocations (minus frees) of tracked objects between young collections; "
        "0 = leave the interpreter's thresholds alone",
        ge=0,
        group="garbage collector",
    )
    gc_threshold1: int = setting(
        GC_THRESHOLDS[1],
        "young collections between middle-generation collections",
        ge=1,
        group="garbage collector",
    )
    gc_threshold2: int = setting(
        GC_THRESHOLDS[2],
        "middle-generation collections between full collections",
        ge=1,
        group="garbage collector",
    )
