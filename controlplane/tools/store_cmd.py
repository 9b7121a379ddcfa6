"""`galaxy store dump | backup | restore`: the state store's records,
decoded; and a backup of its durable part that restores into another store
(docs/operations.md, "Backup and restore")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from controlplane.tools.common import CliError
from statestore import StateStore, StoreError, open_store
from statestore import backup as backups
from statestore.keyspace import KEYSPACE, decode, describe

_STATE_HELP = (
    "state store URL, e.g. etcd://127.0.0.1:2379 or etcds://... (memory:// stores live "
    "only inside their process)"
)


def add_subparser(sub: Any) -> None:
    """``galaxy store dump``."""
    st = sub.add_parser("store", help="inspect the state store")
    ssub = st.add_subparsers(dest="store_command", required=True)
    dump = ssub.add_parser("dump", help="print the records under a prefix, decoded")
    dump.add_argument("--state", required=True, help=_STATE_HELP)
    dump.add_argument("--prefix", default="/galaxy/", help="key prefix (default /galaxy/)")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.add_argument(
        "--keyspace", action="store_true", help="print the documented key space and exit"
    )
    dump.set_defaults(func=cmd_store_dump)
    bk = ssub.add_parser(
        "backup", help="write the durable records (functions, runtimes, tokens, ...) to a file"
    )
    bk.add_argument("--state", required=True, help=_STATE_HELP)
    bk.add_argument("-o", "--out", required=True, help="backup file to write (JSON lines)")
    bk.set_defaults(func=cmd_store_backup)
    rs = ssub.add_parser("restore", help="write a backup's records into a store")
    rs.add_argument("--state", required=True, help=_STATE_HELP)
    rs.add_argument("-f", "--file", required=True, help="backup file (from galaxy store backup)")
    rs.add_argument(
        "--replace",
        action="store_true",
        help="delete the store's durable records first (default: refuse a non-empty store)",
    )
    rs.set_defaults(func=cmd_store_restore)


def _open(url: str) -> StateStore:
    try:
        return open_store(url)
    except ValueError as e:
        raise CliError(f"--state: {e}") from None


async def cmd_store_backup(args: argparse.Namespace) -> int:
    """Write the durable records to ``--out``."""
    store = _open(args.state)
    try:
        records = await backups.snapshot(store)
    except StoreError as e:
        raise CliError(f"state store {args.state}: {e}") from None
    finally:
        await store.close()
    try:
        with open(args.out, "w") as f:  # noqa: ASYNC230 (a local file, once)
            for line in backups.dump_lines(records):
                f.write(line + "\n")
    except OSError as e:
        raise CliError(f"--out: cannot write {args.out}: {e.strerror}") from None
    print(f"{len(records)} durable records written to {args.out}")
    return 0


async def cmd_store_restore(args: argparse.Namespace) -> int:
    """Restore a backup file into ``--state`` (checked whole first)."""
    try:
        with open(args.file) as f:  # noqa: ASYNC230 (a local file, once)
            records = backups.parse_lines(f)
    except OSError as e:
        raise CliError(f"--file: cannot read {args.file}: {e.strerror}") from None
    except backups.BackupError as e:
        raise CliError(f"--file {args.file}: {e}") from None
    store = _open(args.state)
    try:
        n = await backups.restore(store, records, replace=args.replace)
    except backups.BackupError as e:
        raise CliError(str(e)) from None
    except StoreError as e:
        raise CliError(f"state store {args.state}: {e}") from None
    finally:
        await store.close()
    print(f"{n} durable records restored into {args.state}")
    return 0


async def cmd_store_dump(args: argparse.Namespace) -> int:
    """Print every key under ``--prefix`` with its owner and decoded value."""
    if args.keyspace:
        for p in KEYSPACE:
            print(f"{p.prefix}\n  owner: {p.owner}\n  value: {p.encoding}\n  life: {p.lifetime}")
        return 0
    if not args.prefix.startswith("/"):
        raise CliError("--prefix: must start with '/'")
    store = _open(args.state)
    try:
        kvs = await store.get_prefix(args.prefix)
    except StoreError as e:
        raise CliError(f"state store {args.state}: {e}") from None
    finally:
        await store.close()
    for kv in kvs:
        part = describe(kv.key)
        value = decode(kv.key, kv.value)
        if args.json:
            owner = part.owner if part else None
            print(
                json.dumps({"key": kv.key, "version": kv.version, "owner": owner, "value": value})
            )
        else:
            owner = part.owner if part else "unknown"
            print(f"{kv.key}  (v{kv.version}, {owner})")
            print(f"  {json.dumps(value, sort_keys=True)}")
    if not args.json:
        print(f"{len(kvs)} keys under {args.prefix}")
    return 0
