"""`galaxy graphs apply|list|get|delete`: inference graphs stored by the
controller and run by the gateway at ``POST /graphs/NAME`` (docs/models.md,
graphs). Namespaced like functions: a developer token acts on its own
namespace's graphs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from controlplane.runtime import graphspec
from controlplane.runtime.errors import InvalidArgument
from controlplane.tools.common import connect
from controlplane.tools.output import add_output_flag, emit, print_table

_CONTROLLER_HELP = "controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)"


def add_subparser(sub: Any) -> None:
    """``galaxy graphs ...``."""
    p = sub.add_parser("graphs", help="inference graphs the gateway runs at /graphs/NAME")
    gsub = p.add_subparsers(dest="graphs_command", required=True)
    ap = gsub.add_parser("apply", help="store or replace graphs from YAML files")
    ap.add_argument("-f", "--file", action="append", required=True, help="graph YAML file")
    ap.set_defaults(func=cmd_apply)
    ls = gsub.add_parser("list", help="list the graphs you may see")
    add_output_flag(ls)
    ls.set_defaults(func=cmd_list)
    get = gsub.add_parser("get", help="show one graph's document")
    get.add_argument("name", help="graph name")
    add_output_flag(get)
    get.set_defaults(func=cmd_get)
    rm = gsub.add_parser("delete", help="delete a graph")
    rm.add_argument("name", help="graph name")
    rm.set_defaults(func=cmd_delete)
    for sp in (ap, ls, get, rm):
        sp.add_argument("--controller", default=None, help=_CONTROLLER_HELP)


def _load(path: str) -> str:
    """A graph file as the JSON document the controller takes, checked here
    first so a bad file is refused before anything is sent."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        graphspec.parse(doc)
    except (OSError, yaml.YAMLError) as e:
        raise InvalidArgument(f"{path}: {e}") from None
    except InvalidArgument as e:
        raise InvalidArgument(f"{path}: {e.message}") from None
    return orjson.dumps(doc).decode()


async def cmd_apply(args: argparse.Namespace) -> int:
    """Store every graph given; one line each."""
    docs = [_load(f) for f in args.file]
    async with connect(args) as c:
        for d in docs:
            g = await c.apply_graph(d)
            print(f"graph {g.name} stored in namespace {g.namespace} (version {g.version})")
    return 0


def _dict(g: Any) -> dict[str, Any]:
    return {"name": g.name, "namespace": g.namespace, "version": g.version,
            "document": orjson.loads(g.document_json)}  # fmt: skip


async def cmd_list(args: argparse.Namespace) -> int:
    """One line per graph: name, namespace, root router, nodes."""
    async with connect(args) as c:
        graphs = await c.list_graphs()
    docs = [_dict(g) for g in graphs]
    rows = [
        (d["name"], d["namespace"], d["document"]["nodes"]["root"]["router"],
         len(d["document"]["nodes"]), d["version"])
        for d in docs
    ]  # fmt: skip
    emit(
        args.output,
        docs,
        lambda: print_table(("NAME", "NAMESPACE", "ROOT", "NODES", "VERSION"), rows),
    )
    return 0


async def cmd_get(args: argparse.Namespace) -> int:
    """The graph: its document as YAML (table), or the record as JSON/YAML."""
    async with connect(args) as c:
        g = await c.get_graph(args.name)
    d = _dict(g)
    emit(args.output, d, lambda: yaml.safe_dump(d["document"], sys.stdout, sort_keys=False))
    return 0


async def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a graph; the gateways stop serving it within their cache bound."""
    async with connect(args) as c:
        await c.delete_graph(args.name)
    print(f"deleted graph {args.name}")
    return 0
