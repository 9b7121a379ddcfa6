"""Where a KV cache is sent in disaggregated LLM serving: the targets and
ids shared by the instances that move caches (``controlplane.llm.kvwire``)
and the gateway that tells a prefill instance where its cache goes
(``controlplane.gateway.pd``). Pure.

A target is ``http://HOST:PORT`` (another node), ``unix:/path`` (a socket
file), ``unix:@name``, an abstract Unix socket: every instance inside
Galaxy listens on ``@galaxy-kv-<instance id>`` (``local_target``), or
``shm:@name``, the same node's shared memory (a memfd handed over
``@galaxy-kvfd-<instance id>``, ``shm_target``). Abstract
names live in the network namespace, so only processes sharing the node's
namespace reach one, and no file needs a directory both instances see.
"""

from __future__ import annotations

#: KV ids are ours (hex) or a caller's: short, printable, no path tricks.
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
MAX_ID = 64
#: the abstract Unix sockets of an instance's KV inbox: HTTP, shared memory
LOCAL_PREFIX, SHM_PREFIX = "galaxy-kv-", "galaxy-kvfd-"


def valid_id(kv_id: str) -> bool:
    """1-64 of [A-Za-z0-9_-] (KV ids; instance ids in ``local_target``)."""
    return 0 < len(kv_id) <= MAX_ID and set(kv_id) <= _ID_CHARS


def local_target(instance_id: str) -> str:
    """The same-node target of an instance's KV inbox: ``unix:@galaxy-kv-ID``."""
    return f"unix:@{LOCAL_PREFIX}{instance_id}"


def shm_target(instance_id: str) -> str:
    """The same-node shared-memory target of an instance's KV inbox (a memfd
    passed over ``@galaxy-kvfd-ID``; ``controlplane.llm.kvshm``)."""
    return f"shm:@{SHM_PREFIX}{instance_id}"


def unix_path(target: str) -> str:
    """The socket path of a ``unix:`` or ``shm:`` target (``@name``: the
    abstract socket, a NUL then the name)."""
    path = target.split(":", 1)[1]
    return "\0" + path[1:] if path.startswith("@") else path


def valid_target(target: object) -> bool:
    """``http://HOST:PORT``, ``unix:/path``, ``unix:@name`` or ``shm:@name``."""
    return isinstance(target, str) and target.startswith(("http://", "unix:/", "unix:@", "shm:@"))
