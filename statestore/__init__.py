"""Galaxy's state store: one async key-value interface, an in-memory and an etcd backend.

``open_store(url)`` picks the backend from a URL:

* ``memory://`` -> ``MemoryStore`` (in-process; the embedded default)
* ``etcd://host:port[,host:port...]`` -> ``EtcdStore`` (plaintext)
* ``etcds://host:port[,host:port...]`` -> ``EtcdStore`` over TLS; the CA and
  client certificate come from ``GALAXY_ETCD_CA``/``_CERT``/``_KEY``
  (``statestore.etcd_tls``)

``WriteBehind`` batches non-critical writes off the request path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .base import (
    KV,
    EventType,
    LeaseNotFound,
    StateStore,
    StoreError,
    StoreUnavailable,
    Watch,
    WatchEvent,
)
from .etcd import EtcdStore
from .etcd_tls import EtcdTls, tls_env_set
from .memory import MemoryStore
from .writebehind import WriteBehind

__all__ = [
    "KV",
    "EtcdStore",
    "EventType",
    "LeaseNotFound",
    "MemoryStore",
    "StateStore",
    "StoreError",
    "StoreUnavailable",
    "Watch",
    "WatchEvent",
    "WriteBehind",
    "etcd_credentials",
    "open_store",
]

_ACCEPTED = "'memory://', 'etcd://host:port[,host:port...]' or 'etcds://...' (TLS)"


def etcd_credentials(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """etcd user and password from the environment (never from the URL,
    which is printed and visible in process listings): GALAXY_ETCD_USER with
    GALAXY_ETCD_PASSWORD or GALAXY_ETCD_PASSWORD_FILE. ValueError naming the
    variable when one half is missing or the file cannot be read."""
    user = env.get("GALAXY_ETCD_USER") or None
    password = env.get("GALAXY_ETCD_PASSWORD") or None
    path = env.get("GALAXY_ETCD_PASSWORD_FILE")
    if password is None and path:
        try:
            password = Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(
                f"GALAXY_ETCD_PASSWORD_FILE: cannot read {path}: {e.strerror}"
            ) from None
    if (user is None) != (password is None):
        missing = "GALAXY_ETCD_PASSWORD(_FILE)" if user else "GALAXY_ETCD_USER"
        raise ValueError(f"etcd credentials: {missing} is not set")
    return user, password


def open_store(url: str) -> StateStore:
    """Create the store named by ``url`` (no I/O happens until first use).

    Raises ``ValueError`` for any other form, naming the accepted ones.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"state store URL {url!r} has no scheme; use {_ACCEPTED}")
    scheme = scheme.lower()
    if scheme == "memory":
        if rest.strip("/"):
            raise ValueError(f"memory store URL takes no address: {url!r}; use 'memory://'")
        return MemoryStore()
    if scheme in ("etcd", "etcds"):
        endpoints = [e.strip() for e in rest.rstrip("/").split(",") if e.strip()]
        if not endpoints:
            raise ValueError(f"etcd URL {url!r} names no endpoint; use {_ACCEPTED}")
        user, password = etcd_credentials(os.environ)
        tls = None
        if scheme == "etcds":
            tls = EtcdTls.from_env(os.environ)
        elif tls_env_set(os.environ):
            # Certificates given but a plaintext URL: refuse rather than send
            # the key space in clear while the operator believes it is not.
            raise ValueError(
                f"{', '.join(tls_env_set(os.environ))} set but the state URL is etcd:// "
                "(plaintext); use etcds:// for TLS"
            )
        return EtcdStore(endpoints, username=user, password=password, tls=tls)
    raise ValueError(f"unknown state store scheme {scheme!r} in {url!r}; use {_ACCEPTED}")
