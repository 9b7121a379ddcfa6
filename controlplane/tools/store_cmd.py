"""`galaxy store dump`: the state store's records, decoded."""

from __future__ import annotations

import argparse
import json
from typing import Any

from controlplane.tools.common import CliError
from statestore import StoreError, open_store
from statestore.keyspace import KEYSPACE, decode, describe


def add_subparser(sub: Any) -> None:
    """``galaxy store dump``."""
    st = sub.add_parser("store", help="inspect the state store")
    ssub = st.add_subparsers(dest="store_command", required=True)
    dump = ssub.add_parser("dump", help="print the records under a prefix, decoded")
    dump.add_argument(
        "--state",
        required=True,
        help="state store URL, e.g. etcd://127.0.0.1:2379 (memory:// stores live only "
        "inside their process)",
    )
    dump.add_argument("--prefix", default="/galaxy/", help="key prefix (default /galaxy/)")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.add_argument(
        "--keyspace", action="store_true", help="print the documented key space and exit"
    )
    dump.set_defaults(func=cmd_store_dump)


async def cmd_store_dump(args: argparse.Namespace) -> int:
    """Print every key under ``--prefix`` with its owner and decoded value."""
    if args.keyspace:
        for p in KEYSPACE:
            print(f"{p.prefix}\n  owner: {p.owner}\n  value: {p.encoding}\n  life: {p.lifetime}")
        return 0
    if not args.prefix.startswith("/"):
        raise CliError("--prefix: must start with '/'")
    try:
        store = open_store(args.state)
    except ValueError as e:
        raise CliError(f"--state: {e}") from None
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
