"""`-o table|json|yaml` for the CLI's read commands.

Every read command builds plain data (dicts and lists of JSON types, protobuf
messages turned into dicts with their proto field names) and hands it to
``emit`` with a function that prints the table. JSON and YAML carry the same
data, so a script reads ``-o json`` and never parses a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

FORMATS = ("table", "json", "yaml")


def add_output_flag(parser: argparse.ArgumentParser, *, json_alias: bool = False) -> None:
    """Add ``-o/--output {table,json,yaml}`` (and ``--json`` as its old
    spelling where a command had it)."""
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default="table", help="output format (default table)"
    )
    if json_alias:
        parser.add_argument(
            "--json", dest="output", action="store_const", const="json", help="same as -o json"
        )


def as_dict(message: Message) -> dict[str, Any]:
    """A protobuf message as the dict ``-o json`` prints (proto field names)."""
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


def emit(fmt: str, data: Any, table: Callable[[], None]) -> None:
    """Print data as JSON or YAML, or call table() for the table."""
    if fmt == "json":
        json.dump(data, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    elif fmt == "yaml":
        yaml.safe_dump(data, sys.stdout, sort_keys=False, default_flow_style=False)
    else:
        table()


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns as wide as their widest cell, two spaces apart; nothing at
    all when there are no rows (so `$(galaxy functions)` is empty then)."""
    if not rows:
        return
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
