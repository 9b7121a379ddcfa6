"""The state store's key space: every prefix Galaxy writes, who owns it, how
values are encoded and how long they live (docs/state.md has the same table
for readers; ``galaxy store dump`` decodes values with it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from galaxy.v1 import common_pb2


@dataclass(frozen=True)
class Prefix:
    """One part of the key space."""

    prefix: str
    #: the component that writes it
    owner: str
    #: how a value is encoded
    encoding: str
    #: how long a key lives
    lifetime: str
    decode: Callable[[bytes], Any]


def _proto(cls: type[Message]) -> Callable[[bytes], Any]:
    def decode(raw: bytes) -> Any:
        return json_format.MessageToDict(cls.FromString(raw), preserving_proto_field_name=True)

    return decode


def _json(raw: bytes) -> Any:
    return json.loads(raw)


#: Longest prefix first wins (``describe``).
KEYSPACE: tuple[Prefix, ...] = (
    Prefix(
        "/galaxy/functions/",
        "controller",
        "galaxy.v1.FunctionSpec (protobuf)",
        "until the function is deleted (written synchronously: deployed means durable)",
        _proto(common_pb2.FunctionSpec),
    ),
    Prefix(
        "/galaxy/revisions/",
        "controller",
        "galaxy.v1.FunctionSpec (protobuf); key /galaxy/revisions/FUNCTION/NNNNN, immutable",
        "until the function is deleted, or until it is one of more than 20 revisions that "
        "no traffic target names (written with the function's record, in one transaction)",
        _proto(common_pb2.FunctionSpec),
    ),
    Prefix(
        "/galaxy/tokens/",
        "controller",
        'JSON {"id", "name", "role", "namespace", "sha256", "created_unix"}; key '
        "/galaxy/tokens/ID; the SHA-256 of the secret, never the token",
        "until revoked (galaxy tokens delete); written synchronously",
        _json,
    ),
    Prefix(
        "/galaxy/runtimes/",
        "controller",
        "galaxy.v1.ServingRuntime (protobuf); key /galaxy/runtimes/NAME",
        "until the runtime is deleted (written synchronously; deployed functions keep "
        "the command they were resolved to)",
        _proto(common_pb2.ServingRuntime),
    ),
    Prefix(
        "/galaxy/instances/",
        "Dispatch (the owner of the function)",
        "galaxy.v1.InstanceInfo (protobuf); key /galaxy/instances/FUNCTION/INSTANCE",
        "while the instance runs; leased to the writing Dispatch process: gone within "
        "10 s of it dying",
        _proto(common_pb2.InstanceInfo),
    ),
    Prefix(
        "/galaxy/nodes/",
        "ClusterMgr (the owner of the node)",
        "galaxy.v1.NodeStatus (protobuf); key /galaxy/nodes/NODE",
        "while the node is alive; deleted when it is declared dead; leased to the "
        "writing ClusterMgr process: gone within 10 s of it dying",
        _proto(common_pb2.NodeStatus),
    ),
    Prefix(
        "/galaxy/controller/leader",
        "controller (HA)",
        'JSON {"id", "address"}',
        "leased to the leading controller (--ha-ttl-s)",
        _json,
    ),
    Prefix(
        "/galaxy/controller/members/",
        "controller (leader, --ha)",
        "galaxy.v1.ControlInstance (protobuf); key .../members/KIND/ID: the membership "
        "mirrored for a successor controller",
        "leased to the leader (at least 60 s, 10 leader TTLs): a successor adopts it on "
        "takeover; after the control plane stops it expires with that lease",
        _proto(common_pb2.ControlInstance),
    ),
    Prefix(
        "/galaxy/controller/scale/",
        "controller (leader)",
        'JSON {"desired", "term", "code", "reason", ...}; key .../scale/KIND',
        "permanent: the committed scale target of each kind",
        _json,
    ),
    Prefix(
        "/galaxy/controller/actions/",
        "controller (leader)",
        "JSON action record; key .../actions/TERM-SEQ-KIND",
        "permanent log of applied scale actions",
        _json,
    ),
)


def describe(key: str) -> Prefix | None:
    """The part of the key space ``key`` belongs to."""
    best: Prefix | None = None
    for p in KEYSPACE:
        if key.startswith(p.prefix) and (best is None or len(p.prefix) > len(best.prefix)):
            best = p
    return best


def decode(key: str, raw: bytes) -> Any:
    """The value as plain data (JSON-able); unknown keys or undecodable
    values come back as a short description, never an exception."""
    p = describe(key)
    if p is None:
        return {"bytes": len(raw)}
    try:
        return p.decode(raw)
    except (DecodeError, ValueError, UnicodeDecodeError) as e:
        return {"undecodable": f"{type(e).__name__}", "bytes": len(raw)}
