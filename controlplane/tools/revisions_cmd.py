"""`galaxy revisions NAME` and `galaxy traffic NAME TARGET...`: a function's
revisions and how its requests are split across them (canary, pin,
rollback)."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.runtime.validation import short
from controlplane.tools.common import CliError, connect
from controlplane.tools.output import add_output_flag, as_dict, emit, print_table
from galaxy.v1 import common_pb2

_CONTROLLER_HELP = "controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)"


def add_subparsers(sub: Any) -> None:
    """``galaxy revisions`` and ``galaxy traffic``."""
    rv = sub.add_parser("revisions", help="list a function's revisions and their traffic")
    rv.add_argument("name", help="function name")
    rv.add_argument("--controller", default=None, help=_CONTROLLER_HELP)
    add_output_flag(rv)
    rv.set_defaults(func=cmd_revisions)
    tr = sub.add_parser(
        "traffic",
        help="split a function's traffic across revisions",
        description="Examples: `galaxy traffic echo 1=90 2=10` (canary), "
        "`galaxy traffic echo 1=100` (pin or roll back), `galaxy traffic echo latest=100` "
        "(follow each new revision, the default), `galaxy traffic echo 1=100 2=0@canary` "
        "(revision 2 only for requests tagged canary: header Galaxy-Revision-Tag).",
    )
    tr.add_argument("name", help="function name")
    tr.add_argument(
        "targets", nargs="+", metavar="REV=PERCENT[@TAG]", help="REV is a number or 'latest'"
    )
    tr.add_argument("--controller", default=None, help=_CONTROLLER_HELP)
    tr.set_defaults(func=cmd_traffic)


def parse_target(text: str) -> common_pb2.TrafficTarget:
    """REV=PERCENT[@TAG] -> TrafficTarget; CliError naming the bad part."""
    rev, sep, rest = text.partition("=")
    percent, _, tag = rest.partition("@")
    if not sep or not percent.isdigit():
        raise CliError(f"traffic target {short(text)}: expected REV=PERCENT[@TAG], e.g. 2=10")
    if rev == "latest":
        number = 0
    elif rev.isdigit() and int(rev) > 0:
        number = int(rev)
    else:
        raise CliError(f"traffic target {short(text)}: REV must be a revision number or 'latest'")
    return common_pb2.TrafficTarget(revision=number, percent=int(percent), tag=tag)


def _share(spec_traffic: Any, revision: int, latest_ready: str) -> str:
    parts = []
    for t in spec_traffic:
        if t.revision == revision or (t.revision == 0 and latest_ready == str(revision)):
            parts.append(f"{t.percent}%" + (f" @{t.tag}" if t.tag else ""))
    return ", ".join(parts) or "-"


async def cmd_revisions(args: argparse.Namespace) -> int:
    """Print one line per revision: number, share of traffic, command."""
    async with connect(args) as c:
        reply = await c.list_revisions(args.name)
    traffic = list(reply.traffic) or [common_pb2.TrafficTarget(percent=100)]
    latest = max((r.revision for r in reply.revisions), default=0)
    # 'latest' targets are shown on the latest revision (Dispatch may keep
    # them on an older one until the latest has a ready instance).
    rows = [
        (r.revision, r.name, _share(traffic, r.revision, str(latest)), " ".join(r.command)[:60])
        for r in reply.revisions
    ]
    emit(
        args.output,
        as_dict(reply),
        lambda: print_table(("REVISION", "NAME", "TRAFFIC", "COMMAND"), rows),
    )
    return 0


async def cmd_traffic(args: argparse.Namespace) -> int:
    """Replace the traffic split and print it."""
    targets = [parse_target(t) for t in args.targets]
    async with connect(args) as c:
        spec = await c.set_traffic(args.name, targets)
    split = ", ".join(
        f"{t.revision or 'latest'}={t.percent}%" + (f"@{t.tag}" if t.tag else "")
        for t in spec.traffic
    )
    print(f"traffic of {spec.name}: {split} (latest revision {spec.revision})")
    return 0
