"""Model artifacts in function specs (pure: no I/O).

A spec may name the model it serves::

    model:
      uri: http://models.internal/iris-v1.joblib   # or /shared/models/x, file:///...
      format: sklearn
      sha256: 3f1c...                              # optional; checked on arrival
      size_bytes: 5120                             # optional; placement uses it
      warm: {nodes: 2}                             # optional prefetch at deploy

The node agent fetches the bytes into its model cache and gives the runtime
a local path: ``{model}`` in the runtime's command, and ``$GALAXY_MODEL_PATH``
(KServe mounts ``/mnt/models`` for the same purpose). Errors are
InvalidArgument naming the field.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controlplane.runtime.errors import InvalidArgument
from controlplane.runtime.validation import key, short
from galaxy.v1 import common_pb2

#: The runtime command placeholder for the model's local path.
PLACEHOLDER = "{model}"
#: The environment variable that carries the same path.
ENV_PATH = "GALAXY_MODEL_PATH"
SCHEMES = ("file", "http", "https", "s3")
MAX_URI_BYTES = 2048
#: 1 TiB: larger is a typo (or a cluster this cache is not meant for).
MAX_SIZE_BYTES = 1 << 40
MAX_WARM_NODES = 10_000
_FIELDS = {"uri", "format", "sha256", "size_bytes", "warm"}
_FORMAT_RE = re.compile(r"^[a-z0-9._-]{1,32}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def from_dict(doc: Any, base_dir: Path | None) -> common_pb2.ModelRef:
    """The ``model`` mapping of a spec; a relative path is taken from base_dir."""
    if not isinstance(doc, dict):
        raise InvalidArgument("model: must be a mapping with at least 'uri'")
    bad = sorted(str(k) for k in set(doc) - _FIELDS)
    if bad:
        raise InvalidArgument(
            f"model.{key(bad[0])}: unknown field (allowed: {', '.join(sorted(_FIELDS))})"
        )
    uri = doc.get("uri")
    if not isinstance(uri, str) or not uri:
        raise InvalidArgument("model.uri: required string (a path or an http(s) URL)")
    if "://" not in uri and not os.path.isabs(uri) and base_dir is not None:
        uri = str((base_dir / uri).resolve())
    ref = common_pb2.ModelRef(uri=uri)
    for name in ("format", "sha256"):
        v = doc.get(name, "")
        if not isinstance(v, str):
            raise InvalidArgument(f"model.{name}: must be a string, got {short(v)}")
        setattr(ref, name, v)
    size = doc.get("size_bytes", 0)
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidArgument(f"model.size_bytes: must be an integer, got {short(size)}")
    if not 0 <= size <= MAX_SIZE_BYTES:
        raise InvalidArgument(f"model.size_bytes: must be between 0 and {MAX_SIZE_BYTES}")
    ref.size_bytes = size
    warm = doc.get("warm") or {}
    if not isinstance(warm, dict) or set(warm) - {"nodes"}:
        raise InvalidArgument("model.warm: must be a mapping {nodes: N}")
    nodes = warm.get("nodes", 0)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 0 <= nodes <= MAX_WARM_NODES:
        raise InvalidArgument(f"model.warm.nodes: must be an integer from 0 to {MAX_WARM_NODES}")
    ref.warm_nodes = nodes
    check(ref)
    return ref


def check(ref: common_pb2.ModelRef) -> None:
    """The rules of a ModelRef (the controller checks every spec with them)."""
    uri = ref.uri
    if not uri:
        raise InvalidArgument("model.uri: required (a path, an http(s) URL or s3://BUCKET/KEY)")
    if len(uri.encode()) > MAX_URI_BYTES or any(c in uri for c in "\n\r\0"):
        raise InvalidArgument(f"model.uri: at most {MAX_URI_BYTES} bytes, one line")
    scheme = urlsplit(uri).scheme if "://" in uri else "file"
    if scheme not in SCHEMES:
        raise InvalidArgument(
            f"model.uri: scheme {short(scheme)} is not supported (use a path, http://, https:// or s3://)"
        )
    if scheme == "file" and not os.path.isabs(local_path(uri)):
        raise InvalidArgument("model.uri: a path must be absolute (relative to the spec file)")
    if scheme in ("http", "https") and not urlsplit(uri).hostname:
        raise InvalidArgument("model.uri: the URL names no host")
    if scheme == "s3":
        s3_location(uri)
    if ref.format and not _FORMAT_RE.match(ref.format):
        raise InvalidArgument("model.format: 1-32 of a-z, 0-9, '.', '_', '-' (e.g. gguf)")
    if ref.sha256 and not _SHA256_RE.match(ref.sha256):
        raise InvalidArgument("model.sha256: 64 lowercase hex digits")
    if ref.size_bytes > MAX_SIZE_BYTES:
        raise InvalidArgument(f"model.size_bytes: at most {MAX_SIZE_BYTES}")


def s3_location(uri: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://BUCKET/KEY`` URI; InvalidArgument naming
    what is missing. The store's endpoint is the node's (AWS_ENDPOINT_URL),
    not the spec's: one spec runs against whatever store its cluster uses."""
    parts = urlsplit(uri)
    key = parts.path.lstrip("/")
    if not parts.netloc:
        raise InvalidArgument("model.uri: an s3 URI names its bucket (s3://BUCKET/KEY)")
    if not key:
        raise InvalidArgument("model.uri: an s3 URI names its object key (s3://BUCKET/KEY)")
    return parts.netloc, key


def local_path(uri: str) -> str:
    """The path of a file URI (a plain path, or file:///path)."""
    return urlsplit(uri).path if uri.startswith("file://") else uri


def digest(ref: common_pb2.ModelRef) -> str:
    """The cache key: the model's sha256, else the SHA-256 of its uri (two
    functions naming the same bytes by checksum share one cached copy)."""
    return ref.sha256 or hashlib.sha256(ref.uri.encode()).hexdigest()


def command_with_model(command: list[str], path: str) -> list[str]:
    """The instance's command with ``{model}`` replaced by the local path."""
    return [a.replace(PLACEHOLDER, path) for a in command]
