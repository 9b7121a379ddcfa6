"""Backup and restore of the durable part of the key space.

A backup holds the records that define the cluster and outlive every process
(functions and their revisions, serving runtimes, token hashes, the
controller's scale targets and action log): ``DURABLE``. Records that describe
running processes (instances, nodes, the HA leader) are leased to their
writers and rebuilt by the components themselves, so they are not backed up.

The file is JSON lines: a header ``{"galaxy_backup": 1, "keys": N,
"prefixes": [...]}``, then one ``{"key", "value_b64"}`` per record (the exact
bytes, so protobuf records round-trip unchanged). A restore refuses a store
that already holds durable records unless asked to replace them, and writes
in transactions of at most the store's ``max_txn_ops`` records.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator

from .base import StateStore

FORMAT_VERSION = 1
DURABLE: tuple[str, ...] = (
    "/galaxy/functions/",
    "/galaxy/revisions/",
    "/galaxy/runtimes/",
    "/galaxy/tokens/",
    "/galaxy/controller/scale/",
    "/galaxy/controller/actions/",
)


class BackupError(ValueError):
    """A backup file that cannot be restored, or a store that refuses it."""


async def snapshot(store: StateStore) -> list[tuple[str, bytes]]:
    """Every durable record, key order."""
    out: list[tuple[str, bytes]] = []
    for prefix in DURABLE:
        out += [(kv.key, kv.value) for kv in await store.get_prefix(prefix)]
    return sorted(out)


def dump_lines(records: list[tuple[str, bytes]]) -> Iterator[str]:
    """The backup file's lines (header first)."""
    header = {"galaxy_backup": FORMAT_VERSION, "keys": len(records), "prefixes": list(DURABLE)}
    yield json.dumps(header)
    for key, value in records:
        yield json.dumps({"key": key, "value_b64": base64.b64encode(value).decode()})


def parse_lines(lines: Iterable[str]) -> list[tuple[str, bytes]]:
    """Records of a backup file; BackupError naming the line that is wrong.
    Nothing is written before the whole file has been checked."""
    it = iter(enumerate(lines, 1))
    try:
        _, first = next(it)
        header = json.loads(first)
    except (StopIteration, ValueError):
        raise BackupError("line 1: not a Galaxy backup header") from None
    if not isinstance(header, dict) or header.get("galaxy_backup") != FORMAT_VERSION:
        raise BackupError(f"line 1: not a Galaxy backup of format {FORMAT_VERSION}")
    records: list[tuple[str, bytes]] = []
    for n, line in it:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            key, value = item["key"], base64.b64decode(item["value_b64"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise BackupError(f"line {n}: expected {{key, value_b64}}") from None
        if not isinstance(key, str) or not key.startswith(DURABLE):
            raise BackupError(f"line {n}: key outside the durable prefixes")
        records.append((key, value))
    if header.get("keys") != len(records):
        raise BackupError(
            f"the header says {header.get('keys')} keys, the file holds {len(records)} (truncated?)"
        )
    return records


async def restore(store: StateStore, records: list[tuple[str, bytes]], replace: bool) -> int:
    """Write records; with ``replace``, delete the durable prefixes first,
    else refuse (BackupError) if the store holds any durable record."""
    existing = await snapshot(store)
    if existing and not replace:
        raise BackupError(
            f"the store already holds {len(existing)} durable records; restore into an "
            "empty store, or pass --replace to delete them first"
        )
    if replace:
        for prefix in DURABLE:
            await store.delete_prefix(prefix)
    step = max(1, store.max_txn_ops)
    for i in range(0, len(records), step):
        await store.put_many(records[i : i + step])
    return len(records)
