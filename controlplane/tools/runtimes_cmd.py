"""`galaxy runtimes apply|list|get|delete`: the serving runtimes an admin
registers (docs/security.md, "Serving runtimes"). `galaxy up --runtimes
DIR` registers a directory of them at start (launch/up.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from controlplane.runtime import runtimefiles
from controlplane.tools.common import connect
from controlplane.tools.output import add_output_flag, as_dict, emit, print_table

_CONTROLLER_HELP = "controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)"


def add_subparser(sub: Any) -> None:
    """``galaxy runtimes ...``."""
    p = sub.add_parser("runtimes", help="serving runtimes: what functions may run (admin)")
    rsub = p.add_subparsers(dest="runtimes_command", required=True)
    ap = rsub.add_parser("apply", help="register or replace runtimes from YAML files")
    ap.add_argument(
        "-f", "--file", action="append", required=True, help="runtime YAML file or directory"
    )
    ap.set_defaults(func=cmd_apply)
    ls = rsub.add_parser("list", help="list runtimes")
    add_output_flag(ls, json_alias=True)
    ls.set_defaults(func=cmd_list)
    get = rsub.add_parser("get", help="show one runtime (JSON)")
    get.add_argument("name", help="runtime name")
    get.set_defaults(func=cmd_get)
    rm = rsub.add_parser("delete", help="delete a runtime no function uses")
    rm.add_argument("name", help="runtime name")
    rm.set_defaults(func=cmd_delete)
    for sp in (ap, ls, get, rm):
        sp.add_argument("--controller", default=None, help=_CONTROLLER_HELP)


def _load(paths: list[str]) -> list[Any]:
    """Runtimes from files and directories, each checked before any is sent."""
    out = []
    for p in paths:
        out += runtimefiles.load_dir(p) if Path(p).is_dir() else [runtimefiles.load_file(p)]
    return out


async def cmd_apply(args: argparse.Namespace) -> int:
    """Register every runtime given; prints one line each."""
    runtimes = _load(args.file)
    async with connect(args) as c:
        for rt in runtimes:
            stored = await c.put_runtime(rt)
            print(f"runtime {stored.name} stored (version {stored.version})")
    return 0


def _dict(rt: Any) -> dict[str, Any]:
    return as_dict(rt)


async def cmd_list(args: argparse.Namespace) -> int:
    """One line per runtime: name, command template, description."""
    async with connect(args) as c:
        runtimes = await c.list_runtimes()
    rows = [(rt.name, " ".join(rt.command)[:40], rt.description[:60]) for rt in runtimes]
    emit(
        args.output,
        [_dict(rt) for rt in runtimes],
        lambda: print_table(("NAME", "COMMAND", "DESCRIPTION"), rows),
    )
    return 0


async def cmd_get(args: argparse.Namespace) -> int:
    """The runtime as JSON."""
    async with connect(args) as c:
        rt = await c.get_runtime(args.name)
    print(json.dumps(_dict(rt), indent=2))
    return 0


async def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a runtime (refused while a function uses it)."""
    async with connect(args) as c:
        await c.delete_runtime(args.name)
    print(f"deleted runtime {args.name}")
    return 0
